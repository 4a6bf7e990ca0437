/**
 * A click on a dashboard tile picks that rank in the dashboard's actions bar
 * (restart, logs, debug, why, dismiss), so a rank's actions are one click
 * from its tile. The dashboard is ipywidgets (it works in any front end with
 * the bar alone); this only sets the bar's rank `<select>` as a person would,
 * and the widget tells the kernel.
 */

/** Listen on `root` (the document) for clicks on tiles. */
export function pickRankOnTileClick(root: Document): void {
  root.addEventListener('click', event => {
    const tile = (event.target as HTMLElement | null)?.closest<HTMLElement>(
      '.mnb-dashboard .mnb-tile[data-rank]'
    );
    if (!tile) {
      return;
    }
    const select = tile
      .closest('.mnb-dashboard')
      ?.querySelector<HTMLSelectElement>('.mnb-rank-actions select');
    if (!select) {
      return;
    }
    const label = `rank ${tile.dataset.rank}`;
    // ipywidgets writes an option's spaces as no-break spaces.
    const text = (o: HTMLOptionElement) => (o.textContent ?? '').replace(/\u00a0/g, ' ');
    const index = Array.from(select.options).findIndex(o => text(o) === label);
    if (index >= 0 && index !== select.selectedIndex) {
      select.selectedIndex = index;
      select.dispatchEvent(new Event('change', { bubbles: true }));
    }
  });
}
