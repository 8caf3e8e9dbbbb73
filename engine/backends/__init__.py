"""The runtimes a model runs on, behind one written contract (engine/backends/contract.py): ``Runner`` is what the
decoders, the checks and the proposers call, ``Backend`` what a loaded model is run by. torch_runner and llama_cpp
each provide both; nothing above this layer asks which one it holds."""
from engine.backends.contract import Backend, PrefixReuse, Runner, common_prefix

__all__ = ["Backend", "PrefixReuse", "Runner", "common_prefix"]
