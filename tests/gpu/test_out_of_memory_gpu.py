"""Out of memory at load on the cuda backend, through the Engine (issue 17 §4): a context far
beyond the device is one line that names a smaller --ctx, and the same process then loads the
model with a smaller context and replies (what the UI's context field does, without a restart)."""
from __future__ import annotations

import pytest

from memra_engine.errors import OutOfMemory
from memra_engine.generate import Engine
from memra_engine.sampling import SamplingParams

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def long_context_path(tmp_path_factory):
    from memra_engine.model.synthetic import write_synthetic_gguf

    # trained for 16M tokens: a KV cache of hundreds of GB at that context
    return write_synthetic_gguf(tmp_path_factory.mktemp("m") / "long.gguf", preset="tiny-llama", seed=7,
                                head_dim=64, n_head=4, n_kv_head=2, d_model=256, n_layer=64, ctx=1 << 24)


def test_cuda_out_of_memory_at_load_is_one_line_and_a_smaller_context_then_loads(long_context_path):
    with pytest.raises(OutOfMemory) as err:
        Engine.load(long_context_path, backend="cuda", n_ctx=1 << 24)
    message = str(err.value)
    assert "\n" not in message and "--ctx" in message, message
    with Engine.load(long_context_path, backend="cuda", n_ctx=512) as eng:
        result = eng.chat([{"role": "user", "content": "hi"}], SamplingParams(temperature=0.0, max_tokens=8)).collect()
    assert result.done.reason in ("eos", "length") and result.token_ids
