"""Quantize a GGUF with a build's ``llama-quantize`` (cached by output path and input hash)."""

from __future__ import annotations

import os
from pathlib import Path

from tuner import _run, log
from tuner._hash import file_sha256
from tuner.builder.records import load_build_record, write_json
from tuner.errors import UsageError
from tuner.plan.variant import Build
from tuner.targets.quant_types import quant_type


def quantize_model(build: Build, src_gguf: Path, dst_gguf: Path, qtype: str = "Q4_K_M") -> Path:
    """Quantize an F32/F16/BF16 GGUF to ``qtype`` (a :data:`tuner.targets.quant_types.QUANT_TYPES` name, any
    case) with the build's ``llama-quantize``; returns ``dst_gguf``, written atomically with a ``.tuner.json``
    sidecar recording the input hash, by which (and the output path) the result is cached.

    Raises UsageError for an unknown qtype, a missing input or a build without llama-quantize; TunerError
    (log path and last lines) when llama-quantize fails.
    """
    qtype = quant_type(qtype)
    src_gguf, dst_gguf = Path(src_gguf), Path(dst_gguf)
    if not src_gguf.is_file():
        raise UsageError(f"Model {src_gguf} does not exist. Create one with `tuner model synth`.")
    exe = build.exe("llama-quantize")
    if not exe.is_file():
        raise UsageError(f"{exe} does not exist; build with targets including llama-quantize.")
    sidecar = dst_gguf.with_name(dst_gguf.name + ".tuner.json")
    st = src_gguf.stat()
    stat_key = [str(src_gguf.resolve()), st.st_size, st.st_mtime_ns]
    side = load_build_record(sidecar) or {}
    # Hashing a multi-GB model costs seconds; reuse the recorded hash while size and mtime are unchanged.
    in_hash = side.get("input_sha256") if side.get("input_stat") == stat_key else file_sha256(src_gguf)
    if dst_gguf.is_file() and side.get("input_sha256") == in_hash and side.get("qtype") == qtype:
        if side.get("input_stat") != stat_key:
            write_json(sidecar, {**side, "input_stat": stat_key})
        return dst_gguf
    dst_gguf.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst_gguf.with_name(dst_gguf.name + ".partial")
    tmp.unlink(missing_ok=True)
    log_file = dst_gguf.with_name(dst_gguf.name + ".quantize.log")
    log_file.unlink(missing_ok=True)
    with log.step(f"Quantizing {src_gguf.name} -> {dst_gguf.name} ({qtype})"):
        argv: list[str | os.PathLike[str]] = [exe, src_gguf, tmp, qtype, str(os.cpu_count() or 1)]
        _run.run(argv, log_file=log_file, cwd=build.bin_dir, what=f"llama-quantize {qtype}")
    tmp.replace(dst_gguf)
    record = {"input": str(src_gguf), "input_sha256": in_hash, "input_stat": stat_key, "qtype": qtype}
    write_json(sidecar, {**record, "build_id": build.build_id, "log": str(log_file)})
    return dst_gguf
