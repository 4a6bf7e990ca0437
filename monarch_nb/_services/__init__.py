"""What a mesh offers beside calls: logs and metrics, Python stacks with py-spy,
workspaces, SPMD launch, configuration, torch.distributed set-up, and process
hygiene (spawning workers, reaping descendants). Imports the layers below."""
