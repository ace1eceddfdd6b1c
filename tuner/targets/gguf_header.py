"""A fast reader of a GGUF file's header: key/values and tensor infos, never tensor data."""

from __future__ import annotations

import dataclasses
import math
import mmap
import struct
from pathlib import Path
from typing import Any

import gguf


@dataclasses.dataclass(frozen=True, kw_only=True)
class GGUFTensor:
    """A tensor read from a GGUF file."""

    name: str
    ne: tuple[int, ...]
    ggml_type: str
    n_elements: int
    n_bytes: int


_SCALAR_FMT = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


MAX_ARRAY_ITEMS = 1 << 24
"""Most array entries a header may hold in all (the largest vocabularies have about 262k tokens, each with
a score and a type): a hostile header that claims more is refused before its entries are read into lists."""

_MAX_DIMS = 4  # GGML_MAX_DIMS


def parse_gguf(path: Path, *, tensors: bool = False) -> tuple[dict[str, tuple[int, int | None, Any]], list[GGUFTensor]]:
    """The KV section of a GGUF (v2/v3) as ``key -> (type, array subtype, value)``, and its tensor infos.

    gguf.GGUFReader builds a numpy memmap view per string (about 40 s for the 408k strings of the llama-bpe vocab on 2
    cores); this struct walk over an mmap of the header takes well under a second and never reads tensor data. Every
    count is checked against the bytes left in the file (and :data:`MAX_ARRAY_ITEMS`) before anything is read, so a
    hostile header costs no more memory than the file's size allows. ValueError for a non-GGUF or a header that does not
    fit its file (naming the key or tensor).
    """
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        if buf[:4] != b"GGUF":
            raise ValueError("bad magic (not a GGUF file)")
        version, n_tensors, n_kv = struct.unpack_from("<IQQ", buf, 4)
        if version < 2:
            raise ValueError(f"GGUF version {version} is too old")
        off, size, items = 24, len(buf), 0
        where = "the header"

        def fits(n: int, each: int, what: str) -> None:
            if n * each > size - off:
                raise ValueError(f"{where}: {what} of {n} entries does not fit the {size - off} bytes left in the file")

        def string() -> str:
            nonlocal off
            (n,) = struct.unpack_from("<Q", buf, off)
            fits(n, 1, "a string")
            s = buf[off + 8 : off + 8 + n].decode("utf-8", errors="surrogateescape")
            off += 8 + n
            return s

        def scalar(t: int) -> Any:
            nonlocal off
            if t == 8:
                return string()
            if t not in _SCALAR_FMT:
                raise ValueError(f"{where}: unknown value type {t}")
            fmt = _SCALAR_FMT[t]
            (v,) = struct.unpack_from(fmt, buf, off)
            off += struct.calcsize(fmt)
            return v

        kv: dict[str, tuple[int, int | None, Any]] = {}
        fits(n_kv, 12, "a key/value section")  # a key's length and a type at least
        try:
            for _ in range(n_kv):
                key = string()
                where = f"key {key!r}"
                (t,) = struct.unpack_from("<I", buf, off)
                off += 4
                if t != 9:
                    kv[key] = (t, None, scalar(t))
                    continue
                sub, n = struct.unpack_from("<IQ", buf, off)
                off += 12
                items += n
                if items > MAX_ARRAY_ITEMS:
                    raise ValueError(f"{where}: arrays of more than {MAX_ARRAY_ITEMS} entries in all")
                if sub in _SCALAR_FMT:
                    fmt = _SCALAR_FMT[sub]
                    each = struct.calcsize(fmt)
                    fits(n, each, "an array")
                    # struct (not np.frombuffer) so no buffer export outlives the mmap
                    kv[key] = (t, sub, list(struct.unpack_from(f"<{n}{fmt[1:]}", buf, off)) if n else [])
                    off += n * each
                elif sub == 8:
                    fits(n, 8, "an array of strings")
                    kv[key] = (t, sub, [string() for _ in range(n)])
                else:
                    raise ValueError(f"{where}: nested arrays are not supported")
            infos: list[GGUFTensor] = []
            if tensors:
                where = "the tensor infos"
                fits(n_tensors, 24, "a tensor list")  # a name's length, n_dims, type and offset at least
                for _ in range(n_tensors):
                    name = string()
                    where = f"tensor {name!r}"
                    (n_dims,) = struct.unpack_from("<I", buf, off)
                    if n_dims > _MAX_DIMS:
                        raise ValueError(f"{where}: {n_dims} dimensions (ggml has at most {_MAX_DIMS})")
                    ne = struct.unpack_from(f"<{n_dims}Q", buf, off + 4)
                    gtype, _offset = struct.unpack_from("<IQ", buf, off + 4 + 8 * n_dims)
                    off += 4 + 8 * n_dims + 12
                    qtype = gguf.GGMLQuantizationType(gtype)
                    block, nbytes = gguf.GGML_QUANT_SIZES[qtype]
                    n_el = math.prod(ne)
                    n_bytes = n_el // block * nbytes
                    infos.append(
                        GGUFTensor(name=name, ne=tuple(ne), ggml_type=qtype.name, n_elements=n_el, n_bytes=n_bytes)
                    )
        except (struct.error, KeyError) as err:  # truncated, or a type gguf does not know
            raise ValueError(f"{where}: {err}") from None
        except ValueError as err:
            raise ValueError(str(err) if str(err).startswith(where) else f"{where}: {err}") from None
    return kv, infos
