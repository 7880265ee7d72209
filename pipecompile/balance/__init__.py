"""What balancing a pipeline's stages takes, apart from the passes that use it: the costs a
balance weighs (an op's FLOPs, a node's memory, the bytes a cut crosses), the boundaries a
user asks for, the order of independent branches, and the partition problem with its exact
searches (the min-max partition, the replicated search, the objective a pass minimises)."""
