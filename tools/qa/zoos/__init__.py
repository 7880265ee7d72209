"""The model zoos of ``tools/qa/zoo.py``: installing torchvision and timm beside the project
(``install``), each zoo's model list and model-file source (``torchvision_models``,
``timm_models``, ``hf_models``), the model-file template they share (``common``) and the
eager probe with its torch.distributed.pipelining peer (``probe``, run as a script)."""
