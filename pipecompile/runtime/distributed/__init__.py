"""One rank per device under torch.distributed: the launcher, each rank's worker and backend."""
