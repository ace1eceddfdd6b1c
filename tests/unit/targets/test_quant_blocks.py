"""Random ggml blocks for direct Q4_K_M, Q5_K_M and IQ4_XS synthesis: layouts, scale fields, spread, determinism."""

from __future__ import annotations

import io

import gguf
import numpy as np
import pytest

from tuner.targets.models import BLOCK_LAYOUTS, write_random_blocks

# sizeof() of each block in llama.cpp's ggml/src/ggml-common.h (QK_K = 256)
HEADER_SIZES = {"Q4_K": (256, 144), "Q6_K": (256, 210), "Q5_0": (32, 22), "Q5_1": (32, 24), "Q8_0": (32, 34),
                "Q5_K": (256, 176), "IQ4_XS": (256, 136), "IQ4_NL": (32, 18)}  # fmt: skip
# where the fp16 scale fields sit in each struct
HEADER_HALVES = {"Q4_K": (0, 2), "Q6_K": (208,), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,), "Q5_K": (0, 2),
                 "IQ4_XS": (0,), "IQ4_NL": (0,)}  # fmt: skip


def random_blocks(name: str, n_blocks: int, rng: np.random.Generator) -> np.ndarray:
    """``n_blocks`` blocks of ``name`` as write_random_blocks writes them (one chunk), one row per block."""
    buf, lay = io.BytesIO(), BLOCK_LAYOUTS.get(name)
    write_random_blocks(buf, name, n_blocks * (lay.elements if lay else 1), rng)
    return np.frombuffer(buf.getvalue(), dtype=np.uint8).reshape(n_blocks, -1)


@pytest.mark.parametrize("name", sorted(HEADER_SIZES))
def test_layout_matches_ggml_common_and_gguf(name: str) -> None:
    lay = BLOCK_LAYOUTS[name]
    assert (lay.elements, lay.nbytes) == HEADER_SIZES[name]
    assert gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[name]] == HEADER_SIZES[name]
    assert tuple(off for off, _ in lay.halves) == HEADER_HALVES[name]


@pytest.mark.parametrize("name", sorted(HEADER_SIZES))
def test_blocks_have_finite_scales_and_the_f16_paths_spread(name: str) -> None:
    lay = BLOCK_LAYOUTS[name]
    blocks = random_blocks(name, 2048, np.random.default_rng(0))
    assert blocks.shape == (2048, lay.nbytes) and blocks.dtype == np.uint8
    for off, value in lay.halves:
        field = blocks[:, off : off + 2].copy().view(np.float16)
        assert np.all(np.isfinite(field)) and np.all(field == np.float16(value)) and value != 0
    y = gguf.quants.dequantize(blocks, gguf.GGMLQuantizationType[name])
    assert y.shape == (2048, lay.elements) and np.all(np.isfinite(y))
    # N(0, 0.02)'s spread, about centred; IQ4_NL has no offset field and its 16 levels average -5.9 (d*-5.9 = -0.0017)
    assert 0.018 < float(y.std()) < 0.022 and abs(float(y.mean())) < (0.002 if name == "IQ4_NL" else 0.0015)
    other = random_blocks(name, 2048, np.random.default_rng(0))
    assert np.array_equal(blocks, other)  # a pure function of the generator's seed
    assert not np.array_equal(blocks, random_blocks(name, 2048, np.random.default_rng(1)))


def test_write_random_blocks_chunks_sizes_and_seeds() -> None:
    def write(seed: int, chunk: int) -> bytes:
        buf = io.BytesIO()
        n = write_random_blocks(buf, "Q4_K", 256 * 100, np.random.default_rng(seed), chunk_elems=chunk)
        assert n == 100 * 144
        return buf.getvalue()

    a = write(3, 256 * 7)  # 15 chunks, the last one short
    assert len(a) == 100 * 144 and a == write(3, 256 * 7) and a != write(4, 256 * 7)
    assert len(write(3, 1)) == 100 * 144  # a chunk below one block still writes a block at a time
    with pytest.raises(ValueError, match="whole number of Q4_K blocks"):
        write_random_blocks(io.BytesIO(), "Q4_K", 300, np.random.default_rng(0))
    with pytest.raises(ValueError, match="no random-block writer for ggml type Q2_K"):
        random_blocks("Q2_K", 1, np.random.default_rng(0))
