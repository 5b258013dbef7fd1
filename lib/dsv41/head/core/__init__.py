"""The machinery under the doit verbs: nodes and ssh, the cluster, the serving recipe, units, the
launch decision, preflight checks, the checkpoint, the run lock. No module here imports a verb."""
