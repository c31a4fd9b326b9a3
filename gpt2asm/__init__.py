"""gpt2asm: GPT-2 inference on the CPU, every floating-point hot loop in hand-written assembly.

    from gpt2asm import GPT2
    model = GPT2.load("models/gpt2")            # directory with model.safetensors, vocab.json, merges.txt
    print(model.generate("Alan Turing theorized that", max_new_tokens=40, temperature=0))
"""
__version__ = "0.1.0"
__all__ = ["GPT2", "GPT2AsmError", "DownloadError", "CheckpointError", "ContextOverflowError", "InvalidArgumentError",
           "KernelUnavailableError", "LibraryError", "ModelNotFoundError", "NonFiniteLogitsError",
           "NotCopyableError", "ResourceError", "SessionBusyError", "TokenizerError"]


def __getattr__(name):
    """Everything is loaded on first use (PEP 562): GPT2 pulls in numpy and the library, and `python -m
    gpt2asm` runs this file before __main__ installs its Ctrl-C guard, so nothing here may take time."""
    if name == "GPT2":
        from .engine import GPT2
        return GPT2
    if name in __all__:
        from . import errors
        return getattr(errors, name)
    raise AttributeError(f"module 'gpt2asm' has no attribute {name!r}")
