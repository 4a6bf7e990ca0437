"""How a mesh gets its hosts: launchers that start one agent per host (ssh,
SLURM, attach) and jobs as Monarch's ``monarch.job`` (a spec, ``apply()``,
``state()``, ``kill()``; ProcessJob, SlurmJob, KubernetesJob), with the job's
state file. Above the controller, whose host meshes it makes."""
