"""Model architectures: the registry from GGUF `general.architecture` to its forward module.

Each module has FUSED (the weight stacks loaders build), tensor_shapes(cfg) (every tensor it
reads, with the shape the config implies) and forward(ops, weights, cfg, tokens, positions,
last_only) -> logits.
"""
from __future__ import annotations

from types import ModuleType

from memra_engine.errors import UnsupportedModelError
from memra_engine.model import gemma3, llama, mixtral, olmoe, qwen2, qwen3, qwen3moe

ARCHITECTURES: dict[str, ModuleType] = {
    "llama": llama,
    "qwen2": qwen2,
    "qwen3": qwen3,
    "gemma3": gemma3,
    "qwen3moe": qwen3moe,
    "mixtral": mixtral,  # a llama GGUF with experts (config.py names it)
    "olmoe": olmoe,
}


def arch_module(arch: str) -> ModuleType:
    try:
        return ARCHITECTURES[arch]
    except KeyError:
        raise UnsupportedModelError(
            f"unsupported architecture '{arch}' (supported: {', '.join(ARCHITECTURES)})"
        ) from None
