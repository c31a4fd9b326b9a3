"""gpt2asm: GPT-2 inference on the CPU, every floating-point hot loop in hand-written assembly.

    from gpt2asm import GPT2
    model = GPT2.load("models/gpt2")            # directory with model.safetensors, vocab.json, merges.txt
    print(model.generate("Alan Turing theorized that", max_new_tokens=40, temperature=0))
"""
from .errors import (CheckpointError, ContextOverflowError, DownloadError, GPT2AsmError, InvalidArgumentError,
                     KernelUnavailableError, LibraryError, ModelNotFoundError, NonFiniteLogitsError,
                     SessionBusyError, TokenizerError)

__version__ = "0.1.0"
__all__ = ["GPT2", "GPT2AsmError", "DownloadError", "CheckpointError", "ContextOverflowError", "InvalidArgumentError",
           "KernelUnavailableError", "LibraryError", "ModelNotFoundError", "NonFiniteLogitsError",
           "SessionBusyError", "TokenizerError"]


def __getattr__(name):                          # GPT2 pulls in numpy and the library: load lazily
    if name == "GPT2":
        from .engine import GPT2
        return GPT2
    raise AttributeError(name)
