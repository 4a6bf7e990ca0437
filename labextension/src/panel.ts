/**
 * The "Mesh" side panel: every mesh of the current notebook's kernel, its
 * ranks' states, its failures, and stop / restart / interrupt buttons; a
 * click on a rank shows that rank's actions (restart it alone, its log, debug,
 * why), as Ray's dashboard offers per worker.
 *
 * It talks to the kernel over a comm to target `monarch_nb.panel` (served by
 * `monarch_nb/magics/_panel.py` once `%load_ext monarch_nb` ran): the kernel
 * sends snapshots, the panel sends actions. The panel opens the comm when it
 * meets a kernel, and again when that kernel runs code naming monarch_nb (a
 * `%load_ext monarch_nb` later on). The kernel never opens one itself: a front
 * end without this panel (nbconvert, nbval) would warn that it has no handler.
 */
import { Dialog, showDialog } from '@jupyterlab/apputils';
import type { ISessionContext } from '@jupyterlab/apputils';
import type { Kernel, KernelMessage } from '@jupyterlab/services';
import { INotebookTracker, NotebookActions, NotebookPanel } from '@jupyterlab/notebook';
import { LabIcon } from '@jupyterlab/ui-components';
import { Widget } from '@lumino/widgets';

export const COMM_TARGET = 'monarch_nb.panel';
export const PANEL_ID = 'monarch-nb-panel';

const GRID_SVG = `<svg xmlns="http://www.w3.org/2000/svg" width="16" height="16" viewBox="0 0 16 16">
<g class="jp-icon3" fill="#616161">
<circle cx="3" cy="3" r="1.8"/><circle cx="8" cy="3" r="1.8"/><circle cx="13" cy="3" r="1.8"/>
<circle cx="3" cy="8" r="1.8"/><circle cx="8" cy="8" r="1.8"/><circle cx="13" cy="8" r="1.8"/>
<circle cx="3" cy="13" r="1.8"/><circle cx="8" cy="13" r="1.8"/><circle cx="13" cy="13" r="1.8"/>
</g></svg>`;

export const meshIcon = new LabIcon({ name: 'monarch-nb:mesh', svgstr: GRID_SVG });

/** One rank in a snapshot (see `panel_snapshot()` in the kernel). */
interface IRank {
  rank: number;
  host: string;
  pid: number;
  state: string;
  work_text: string;
  cpu_percent: number | null;
  rss_bytes: number | null;
  heartbeat_age: number | null;
  returncode: number | null;
  failure: string | null;
}

interface IMesh {
  name: string;
  state: string;
  failure: string | null;
  dist: string | null;
  default: boolean;
  shape: Record<string, number>;
  ranks: IRank[];
}

interface IFailure {
  mesh: string;
  rank: number | null;
  failure: string;
  returncode: number | null;
}

interface ISnapshot {
  type: 'snapshot';
  taken_at: number;
  meshes: IMesh[];
  failures: IFailure[];
}

/** `%mesh dashboard --side`: show this panel, at that mesh. */
interface IReveal {
  type: 'reveal';
  mesh: string;
}

interface IResult {
  type: 'result';
  action: string;
  mesh: string;
  ok: boolean;
  message: string;
  rank?: number; // a rank's action: its detail (a log, a stack) and a cell to run
  detail?: string;
  command?: string;
}

/** What a rank's buttons do (see `monarch_nb/widgets/_rank_actions.py`). */
const RANK_ACTIONS: Record<string, string> = {
  restart: "a fresh process for this rank alone (the other ranks keep theirs)",
  logs: "the last lines this rank wrote to its log",
  debug: "its stack now; inserts the cell that opens pdb where its last call raised",
  why: "%mesh why: which ranks wait in which collective, and where the others are"
};

/** A result message is shown until what it speaks of changes (a new failure) or
 * this long has passed: an old "restarted" line must not sit under a new failure. */
const MESSAGE_TTL_MS = 20_000;

function escape(text: unknown): string {
  const div = document.createElement('div');
  div.textContent = String(text ?? '');
  return div.innerHTML;
}

function mebibytes(n: number | null): string {
  return n === null ? '-' : `${Math.round(n / 2 ** 20)} MiB`;
}

/** A kernel's comm and what it last said. */
interface IConnection {
  comm: Kernel.IComm | null;
  snapshot: ISnapshot | null;
}

export class MeshPanel extends Widget {
  private _connections = new Map<Kernel.IKernelConnection, IConnection>();
  private _session: ISessionContext | null = null;
  private _message = '';
  private _messageAt = 0;
  private _messageFailures: string[] = []; // the failures shown when it was set
  private _revealed = ''; // the mesh %mesh dashboard --side asked for, outlined
  private _selected: { mesh: string; rank: number } | null = null; // its actions shown
  private _detail: IResult | null = null; // the last rank action's log or stack

  /** `activate()` brings the panel into view (the shell's activateById). */
  constructor(
    private _tracker: INotebookTracker,
    private _activate: () => void = () => undefined
  ) {
    super();
    this.id = PANEL_ID;
    this.addClass('jp-MonarchNbPanel');
    this.title.icon = meshIcon;
    this.title.caption = 'Mesh (monarch_nb)';
    this.node.addEventListener('click', event => this._onClick(event));
    _tracker.currentChanged.connect((_, panel) => this._follow(panel));
    this._follow(_tracker.currentWidget);
  }

  /** The kernel of the notebook in focus, if any. */
  get kernel(): Kernel.IKernelConnection | null {
    return this._session?.session?.kernel ?? null;
  }

  private _follow(panel: NotebookPanel | null): void {
    this._session?.kernelChanged.disconnect(this._onKernelChanged, this);
    this._session = panel?.sessionContext ?? null;
    this._session?.kernelChanged.connect(this._onKernelChanged, this);
    this._message = '';
    if (this._session) {
      void this._session.ready.then(() => this._connect(this.kernel));
    }
    this._connect(this.kernel);
  }

  private _onKernelChanged(): void {
    this._connect(this.kernel);
  }

  private _connect(kernel: Kernel.IKernelConnection | null): void {
    if (kernel && !this._connections.has(kernel)) {
      const connection: IConnection = { comm: null, snapshot: null };
      this._connections.set(kernel, connection);
      kernel.iopubMessage.connect((_, msg) => {
        // The comm_open goes after this cell on the kernel's shell channel, so
        // the kernel answers it once the cell (and its %load_ext) has run.
        if (
          !connection.comm &&
          msg.header.msg_type === 'execute_input' &&
          String((msg.content as { code?: unknown }).code).includes('monarch_nb')
        ) {
          this._open(kernel);
        }
      });
      kernel.statusChanged.connect((_, status) => {
        if (status === 'restarting' || status === 'autorestarting' || status === 'dead') {
          connection.comm = null;
          connection.snapshot = null;
          this._render();
        }
      });
      kernel.disposed.connect(() => this._connections.delete(kernel));
      this._open(kernel);
    }
    this._render();
  }

  /** Ask the kernel for a comm; it closes it at once if monarch_nb is not loaded. */
  private _open(kernel: Kernel.IKernelConnection): void {
    try {
      const comm = kernel.createComm(COMM_TARGET);
      this._adopt(kernel, comm);
      comm.open({});
    } catch (error) {
      console.warn('monarch_nb: could not open the panel comm', error);
    }
  }

  private _adopt(kernel: Kernel.IKernelConnection, comm: Kernel.IComm): void {
    const connection = this._connections.get(kernel);
    if (!connection) {
      return;
    }
    connection.comm = comm;
    comm.onMsg = (msg: KernelMessage.ICommMsgMsg) => {
      const data = msg.content.data as unknown as ISnapshot | IResult | IReveal;
      if (data.type === 'snapshot') {
        connection.snapshot = data;
      } else if (data.type === 'result' && data.action !== 'refresh') {
        this._setMessage(data.message, connection.snapshot);
        if (data.rank !== undefined && data.rank !== null) {
          this._detail = data;
          if (data.command && data.ok) {
            this._insertCell(data.command);
          }
        }
      }
      if (kernel === this.kernel) {
        this._render();
        if (data.type === 'reveal') {
          this._reveal(data.mesh);
        }
      }
    };
    comm.onClose = () => {
      if (connection.comm === comm) {
        connection.comm = null;
        this._render();
      }
    };
  }

  private _reveal(mesh: string): void {
    this._activate();
    this._revealed = mesh;
    this._render();
    const node = this.node.querySelector<HTMLElement>(
      `.jp-MonarchNb-mesh[data-mesh="${CSS.escape(mesh)}"]`
    );
    node?.scrollIntoView({ block: 'nearest' });
  }

  /** The failures the panel shows: a message is older than any not among them. */
  private _failuresKey(snapshot: ISnapshot | null): string[] {
    if (!snapshot) {
      return [];
    }
    return [
      ...snapshot.meshes.filter(m => m.failure).map(m => `${m.name}: ${m.failure}`),
      ...snapshot.failures.map(f => `${f.mesh} ${f.rank}: ${f.failure}`)
    ];
  }

  private _setMessage(message: string, snapshot: ISnapshot | null): void {
    this._message = message;
    this._messageAt = Date.now();
    this._messageFailures = this._failuresKey(snapshot);
  }

  /** The message, unless a new failure came since or it is old. */
  private _currentMessage(snapshot: ISnapshot | null | undefined): string {
    if (!this._message) {
      return '';
    }
    const known = new Set(this._messageFailures);
    const stale =
      Date.now() - this._messageAt > MESSAGE_TTL_MS ||
      this._failuresKey(snapshot ?? null).some(failure => !known.has(failure));
    if (stale) {
      this._message = '';
    }
    return this._message;
  }

  /** A cell below the active one with `command`, ready to run (pdb needs a cell). */
  private _insertCell(command: string): void {
    const notebook = this._tracker.currentWidget?.content;
    if (!notebook) {
      return;
    }
    NotebookActions.insertBelow(notebook);
    notebook.activeCell?.model.sharedModel.setSource(command);
    this._message += ` (inserted \`${command}\` below the active cell: run it)`;
  }

  private _onClick(event: MouseEvent): void {
    const target = event.target as HTMLElement;
    const button = target.closest<HTMLButtonElement>('button[data-action]');
    const row = target.closest<HTMLElement>('tr.jp-MonarchNb-rank');
    if (!button && row) {
      const mesh = row.closest<HTMLElement>('.jp-MonarchNb-mesh')?.dataset.mesh ?? '';
      const rank = Number(row.dataset.rank);
      const same = this._selected?.mesh === mesh && this._selected?.rank === rank;
      this._selected = same ? null : { mesh, rank };
      this._render();
      return;
    }
    const kernel = this.kernel;
    const comm = kernel ? this._connections.get(kernel)?.comm : null;
    if (!button || !kernel || !comm) {
      return;
    }
    const action = button.dataset.action!;
    const mesh = button.dataset.mesh!;
    if (button.dataset.rank !== undefined) {
      this._rankAction(kernel, comm, action, mesh, Number(button.dataset.rank));
      return;
    }
    if (action === 'restart' || action === 'stop') {
      // Both end every rank's process: its variables, actors and tensors are gone.
      void showDialog({
        title: `${action === 'stop' ? 'Stop' : 'Restart'} mesh '${mesh}'?`,
        body:
          action === 'stop'
            ? 'Every rank stops; its variables, actors and tensors are lost.'
            : 'Every rank gets a fresh process; its variables, actors and tensors are lost.',
        buttons: [Dialog.cancelButton(), Dialog.warnButton({ label: action })]
      }).then(answer => {
        if (answer.button.accept) {
          this._send(kernel, comm, action, mesh);
        }
      });
      return;
    }
    if (action === 'interrupt' && kernel.status === 'busy') {
      // The kernel runs a cell: the comm would wait for it. The kernel's own
      // interrupt reaches every busy rank of every mesh.
      void kernel.interrupt();
      this._message = 'interrupted the kernel (every busy rank gets KeyboardInterrupt)';
      this._render();
    } else {
      this._send(kernel, comm, action, mesh);
    }
  }

  private _rankAction(
    kernel: Kernel.IKernelConnection,
    comm: Kernel.IComm,
    action: string,
    mesh: string,
    rank: number
  ): void {
    if (action !== 'restart') {
      this._send(kernel, comm, action, mesh, rank);
      return;
    }
    void showDialog({
      title: `Restart rank ${rank} of '${mesh}'?`,
      body:
        `Rank ${rank} gets a fresh process: its variables, actors and tensors are lost. ` +
        'The other ranks keep theirs.',
      buttons: [Dialog.cancelButton(), Dialog.warnButton({ label: 'restart rank' })]
    }).then(answer => {
      if (answer.button.accept) {
        this._send(kernel, comm, action, mesh, rank);
      }
    });
  }

  private _send(
    kernel: Kernel.IKernelConnection,
    comm: Kernel.IComm,
    action: string,
    mesh: string,
    rank?: number
  ): void {
    comm.send(rank === undefined ? { action, mesh } : { action, mesh, rank });
    const what = rank === undefined ? `'${mesh}'` : `rank ${rank} of '${mesh}'`;
    this._setMessage(
      kernel.status === 'busy'
        ? `${action} of ${what} runs when the current cell ends`
        : `${action} of ${what}...`,
      this._connections.get(kernel)?.snapshot ?? null
    );
    this._render();
  }

  private _render(): void {
    const kernel = this.kernel;
    const connection = kernel ? this._connections.get(kernel) : undefined;
    const parts: string[] = ['<div class="jp-MonarchNb-title">Mesh</div>'];
    if (!kernel) {
      parts.push('<p class="jp-MonarchNb-note">Open a notebook to see its meshes.</p>');
    } else if (!connection?.comm) {
      parts.push(
        '<p class="jp-MonarchNb-note jp-MonarchNb-disconnected">This kernel has not loaded ' +
          'monarch_nb: run <code>%load_ext monarch_nb</code>.</p>'
      );
    } else if (!connection.snapshot || connection.snapshot.meshes.length === 0) {
      parts.push(
        '<p class="jp-MonarchNb-note jp-MonarchNb-empty">No mesh is running in this kernel: ' +
          '<code>%mesh start --procs 4</code> starts one.</p>'
      );
    } else {
      for (const mesh of connection.snapshot.meshes) {
        parts.push(this._renderMesh(mesh));
      }
    }
    const failures = connection?.comm ? connection.snapshot?.failures ?? [] : [];
    if (failures.length) {
      parts.push('<div class="jp-MonarchNb-failures"><div class="jp-MonarchNb-subtitle">Failures</div><ul>');
      for (const f of failures) {
        const where = f.rank === null ? `mesh '${f.mesh}'` : `'${f.mesh}' rank ${f.rank}`;
        parts.push(`<li data-mesh="${escape(f.mesh)}"><b>${escape(where)}</b>: ${escape(f.failure)}</li>`);
      }
      parts.push('</ul></div>');
    }
    const message = this._currentMessage(connection?.snapshot);
    if (message) {
      parts.push(`<p class="jp-MonarchNb-message">${escape(message)}</p>`);
    }
    this.node.innerHTML = parts.join('');
  }

  private _renderMesh(mesh: IMesh): string {
    const facts = [
      `<span class="jp-MonarchNb-state" data-state="${escape(mesh.state)}">${escape(mesh.state)}</span>`,
      `${mesh.ranks.length} ranks`,
      Object.entries(mesh.shape)
        .map(([k, v]) => `${escape(k)}: ${v}`)
        .join(', ')
    ];
    if (mesh.dist) {
      facts.push(escape(mesh.dist));
    }
    if (mesh.default) {
      facts.push('default');
    }
    const button = (action: string, title: string) =>
      `<button class="jp-Button jp-mod-styled jp-MonarchNb-action" data-action="${action}" ` +
      `data-mesh="${escape(mesh.name)}" title="${escape(title)}">${action}</button>`;
    const rows = mesh.ranks
      .map(
        r =>
          `<tr class="jp-MonarchNb-rank${this._isSelected(mesh, r) ? ' jp-MonarchNb-selected' : ''}"` +
          ` data-rank="${r.rank}" data-pid="${r.pid}" data-state="${escape(r.state)}"` +
          ` title="${escape(`${r.host} pid ${r.pid}` + (r.failure ? `\n${r.failure}` : '') + '\nclick: this rank\'s actions')}">` +
          `<td class="jp-MonarchNb-rankNumber">${r.rank}</td><td class="jp-MonarchNb-rankState">${escape(r.state)}</td>` +
          `<td class="jp-MonarchNb-work" title="${escape(r.work_text)}">` +
          `${escape(r.work_text.replace(/^%%mesh /, ''))}</td>` +
          `<td class="jp-MonarchNb-cpu">${r.cpu_percent === null ? '-' : Math.round(r.cpu_percent) + '%'}</td>` +
          `<td class="jp-MonarchNb-rss">${mebibytes(r.rss_bytes)}</td><td class="jp-MonarchNb-pid">${r.pid}</td></tr>`
      )
      .join('');
    return (
      `<div class="jp-MonarchNb-mesh${mesh.name === this._revealed ? ' jp-MonarchNb-revealed' : ''}" ` +
      `data-mesh="${escape(mesh.name)}" data-state="${escape(mesh.state)}">` +
      `<div class="jp-MonarchNb-meshHeader"><b class="jp-MonarchNb-meshName">${escape(mesh.name)}</b> ` +
      `${facts.join(' · ')}</div>` +
      (mesh.failure ? `<pre class="jp-MonarchNb-meshFailure">${escape(mesh.failure)}</pre>` : '') +
      `<div class="jp-MonarchNb-actions">` +
      button('interrupt', 'KeyboardInterrupt in every busy rank') +
      button('restart', 'fresh processes (namespaces start empty)') +
      button('stop', 'stop the processes and forget this mesh') +
      `</div><table class="jp-MonarchNb-ranks"><thead><tr><th class="jp-MonarchNb-rankNumber">rank</th>` +
      `<th class="jp-MonarchNb-rankState">state</th><th class="jp-MonarchNb-work">work</th>` +
      `<th class="jp-MonarchNb-cpu">cpu</th><th class="jp-MonarchNb-rss">rss</th>` +
      `<th class="jp-MonarchNb-pid">pid</th></tr></thead><tbody>${rows}</tbody></table>` +
      this._renderRankActions(mesh) +
      '</div>'
    );
  }

  private _isSelected(mesh: IMesh, rank: IRank): boolean {
    return this._selected?.mesh === mesh.name && this._selected?.rank === rank.rank;
  }

  /** The selected rank's buttons, and what its last action brought back. */
  private _renderRankActions(mesh: IMesh): string {
    const rank = mesh.ranks.find(r => this._isSelected(mesh, r));
    if (!rank) {
      const troubled = mesh.ranks.some(r => r.state === 'failed' || r.state === 'dead');
      return troubled
        ? '<p class="jp-MonarchNb-note jp-MonarchNb-rankHint">Click a rank for its ' +
            'actions: restart it alone, its log, debug, why.</p>'
        : '';
    }
    const buttons = Object.entries(RANK_ACTIONS)
      .map(
        ([action, title]) =>
          `<button class="jp-Button jp-mod-styled jp-MonarchNb-action jp-MonarchNb-rankAction" ` +
          `data-action="${action}" data-mesh="${escape(mesh.name)}" data-rank="${rank.rank}" ` +
          `title="${escape(title)}">${action}</button>`
      )
      .join('');
    const detail =
      this._detail && this._detail.mesh === mesh.name && this._detail.rank === rank.rank
        ? `<pre class="jp-MonarchNb-rankDetail">${escape(this._detail.detail || this._detail.message)}</pre>`
        : '';
    return (
      `<div class="jp-MonarchNb-rankActions" data-mesh="${escape(mesh.name)}" data-rank="${rank.rank}">` +
      `<div class="jp-MonarchNb-subtitle">rank ${rank.rank} · ${escape(rank.state)}</div>` +
      `<div class="jp-MonarchNb-actions">${buttons}</div>${detail}</div>`
    );
  }
}
