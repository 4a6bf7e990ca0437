/**
 * %%mesh cells, marked in the notebook: a badge under the cell's prompt with
 * the ranks the cell runs on ("all", "0,2-3", "procs=0"), and a CSS class on
 * the cell. Read from the cell's first line, as the kernel parses it.
 */
import type { Cell } from '@jupyterlab/cells';
import { INotebookTracker, NotebookPanel } from '@jupyterlab/notebook';

export const BADGE_CLASS = 'jp-MonarchNb-badge';
export const MESH_CELL_CLASS = 'jp-MonarchNb-meshCell';

/** What a cell's `%%mesh` line targets, or null for any other cell. */
export interface IMeshTarget {
  mesh: string | null;
  ranks: string;
}

export function meshTarget(source: string): IMeshTarget | null {
  const first = source.split('\n', 1)[0].trim();
  if (!/^%%mesh(\s|$)/.test(first)) {
    return null;
  }
  const words = first.split(/\s+/).slice(1);
  let mesh: string | null = null;
  let ranks: string | null = null;
  const where: string[] = [];
  for (let i = 0; i < words.length; i++) {
    const [flag, inline] = words[i].split(/=(.*)/s, 2);
    const value = () => (inline !== undefined ? inline : words[++i] ?? '');
    if (flag === '--ranks') {
      ranks = value();
    } else if (flag === '--where') {
      where.push(value());
    } else if (flag === '--mesh') {
      mesh = value();
    }
  }
  return { mesh, ranks: ranks ?? (where.length ? where.join(' ') : 'all') };
}

function badgeText(target: IMeshTarget): string {
  return target.mesh ? `${target.mesh}: ${target.ranks}` : target.ranks;
}

/** Keeps the badges of every notebook's cells up to date as their source changes. */
export class CellBadges {
  private _seen = new WeakSet<Cell>();

  constructor(tracker: INotebookTracker) {
    tracker.widgetAdded.connect((_, panel) => this._watchNotebook(panel));
    tracker.forEach(panel => this._watchNotebook(panel));
  }

  private _watchNotebook(panel: NotebookPanel): void {
    const scan = () => panel.content.widgets.forEach(cell => this._watchCell(cell));
    void panel.context.ready.then(() => {
      scan();
      panel.content.model?.cells.changed.connect(scan);
    });
  }

  private _watchCell(cell: Cell): void {
    if (this._seen.has(cell) || cell.model.type !== 'code') {
      return;
    }
    this._seen.add(cell);
    const update = () => CellBadges.mark(cell);
    cell.model.contentChanged.connect(update);
    void cell.ready.then(update); // a windowed notebook builds a cell's DOM lazily
  }

  static mark(cell: Cell): void {
    if (cell.isDisposed) {
      return;
    }
    const target = meshTarget(cell.model.sharedModel.getSource());
    cell.toggleClass(MESH_CELL_CLASS, target !== null);
    const area = cell.inputArea?.node;
    if (!area) {
      return;
    }
    let badge = area.querySelector<HTMLElement>(`:scope > .${BADGE_CLASS}`);
    if (target === null) {
      badge?.remove();
      return;
    }
    if (!badge) {
      badge = document.createElement('div');
      badge.className = BADGE_CLASS;
      area.appendChild(badge); // not in the prompt: it rewrites its own text
    }
    badge.textContent = badgeText(target);
    badge.dataset.ranks = target.ranks;
    badge.title =
      `%%mesh cell: runs on ` +
      (target.ranks === 'all' ? 'every rank' : `ranks ${target.ranks}`) +
      (target.mesh ? ` of mesh '${target.mesh}'` : ' of the default mesh');
  }
}
