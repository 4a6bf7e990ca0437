import { ILayoutRestorer, JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { INotebookTracker } from '@jupyterlab/notebook';

import { CellBadges } from './badges';
import { MeshPanel } from './panel';
import { pickRankOnTileClick } from './tiles';

/** The Mesh panel in the left sidebar, badges on %%mesh cells, and dashboard tiles
 * that pick their rank's actions when clicked. */
const plugin: JupyterFrontEndPlugin<void> = {
  id: 'monarch-nb:panel',
  description: 'The meshes of the current kernel (monarch_nb), their ranks and controls',
  autoStart: true,
  requires: [INotebookTracker],
  optional: [ILayoutRestorer],
  activate: (
    app: JupyterFrontEnd,
    tracker: INotebookTracker,
    restorer: ILayoutRestorer | null
  ) => {
    const panel = new MeshPanel(tracker, () => app.shell.activateById(panel.id));
    app.shell.add(panel, 'left', { rank: 650 });
    restorer?.add(panel, panel.id);
    new CellBadges(tracker);
    pickRankOnTileClick(document);
  }
};

export default plugin;
