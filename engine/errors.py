"""The one error hierarchy. Each error carries a one-line message a user can act on.

The CLI and the UI catch MemraError at the top and show str(err). Anything else is a bug.
"""


class MemraError(Exception):
    """Base for every error a user can see and act on."""


class ModelFormatError(MemraError):
    """The file is not a valid GGUF (bad magic, truncated, absurd sizes, missing tensor)."""


class UnsupportedModelError(MemraError):
    """A valid GGUF we cannot run (unknown architecture or quant type)."""


class TemplateError(MemraError):
    """The chat template raised or could not be rendered."""


class ContextOverflowError(MemraError):
    """The prompt does not fit in the context window."""


class DeviceError(MemraError):
    """No usable GPU, kernels missing, or a CUDA failure."""


class OutOfMemory(MemraError):
    """An allocation did not fit: in VRAM (DeviceOutOfMemory) or in host memory (HostOutOfMemory).
    The UI offers a smaller context for either."""


class DeviceOutOfMemory(DeviceError, OutOfMemory):
    """An allocation did not fit in the VRAM pool."""


class HostOutOfMemory(OutOfMemory):
    """A host allocation failed (numpy raised MemoryError): the CPU backend's weights or KV cache."""


class GrammarError(MemraError):
    """The grammar is invalid."""


class ModelFetchError(MemraError):
    """The default model could not be fetched or failed its checksum."""


class RemoteError(MemraError):
    """An OpenAI-compatible server could not be reached, or refused or broke off a request."""
