"""Read and write safetensors checkpoints with numpy only.

The format: an 8-byte little-endian header length N, N bytes of JSON
({name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}),
then the raw little-endian tensor bytes; offsets are relative to the end of the header.
A sharded checkpoint is model-0000i-of-0000N.safetensors plus model.safetensors.index.json
whose "weight_map" names the file that holds each tensor.

Tensors travel as (dtype, storage) pairs: dtype is the safetensors name ("F32", "BF16", "F16",
"F8_E4M3") and storage is the numpy array of the bits as stored (float32, uint16 for BF16,
float16, uint8 for F8_E4M3). encode() makes storage from float values, decode() goes back.
"""

import json
import math
import os
import struct

import numpy as np

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"

# Storage numpy dtype for each safetensors dtype we handle.
_STORAGE = {
    "F32": np.dtype("<f4"),
    "F64": np.dtype("<f8"),
    "BF16": np.dtype("<u2"),
    "F16": np.dtype("<f2"),
    "F8_E4M3": np.dtype("u1"),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
}

# ---------------------------------------------------------------------------------------------
# bfloat16: the top 16 bits of a float32.


def f32_to_bf16_bits(x):
    """float32 array -> uint16 bf16 bits, rounding to nearest, ties to even; NaN stays NaN."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    # Adding 0x7FFF plus the lowest kept bit rounds half-way cases towards an even result.
    lsb = (bits >> np.uint32(16)) & np.uint32(1)
    rounded = (bits + np.uint32(0x7FFF) + lsb) >> np.uint32(16)
    # The add could turn a NaN payload into an infinity: keep NaNs quiet NaNs instead.
    nan = np.isnan(np.asarray(x, dtype=np.float32))
    rounded = np.where(nan, (bits >> np.uint32(16)) | np.uint32(0x0040), rounded)
    return rounded.astype(np.uint16)


def bf16_bits_to_f32(b):
    return (np.asarray(b, dtype=np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)


# ---------------------------------------------------------------------------------------------
# float8 e4m3fn: 1 sign, 4 exponent (bias 7), 3 mantissa bits; no infinities; 0x7F/0xFF are NaN;
# the largest finite value is 0x7E = 1.75 * 2^8 = 448.

E4M3_MAX = 448.0


def _e4m3_positive_table():
    """Values of codes 0x00..0x7E (all finite non-negative codes), increasing with the code."""
    vals = np.empty(0x7F, dtype=np.float64)
    for code in range(0x7F):
        exp, man = code >> 3, code & 7
        if exp == 0:
            vals[code] = man * 2.0 ** -9  # subnormal: m/8 * 2^(1-7)
        else:
            vals[code] = (1.0 + man / 8.0) * 2.0 ** (exp - 7)
    return vals


_E4M3_POS = _e4m3_positive_table()
_E4M3_DECODE = np.concatenate([_E4M3_POS, [np.nan], -_E4M3_POS, [np.nan]]).astype(np.float32)


def f32_to_e4m3_bits(x):
    """float array -> uint8 e4m3fn codes: nearest representable value, ties to the even code,
    saturating at +-448 (there is no infinity to overflow to); NaN -> 0x7F."""
    x = np.asarray(x, dtype=np.float64)
    mag = np.minimum(np.abs(x), E4M3_MAX)
    mag = np.where(np.isnan(mag), 0.0, mag)
    # Codes are monotonic in value, so the nearest code is one of the two around searchsorted.
    hi = np.clip(np.searchsorted(_E4M3_POS, mag, side="left"), 0, 0x7E)
    lo = np.maximum(hi - 1, 0)
    d_lo = mag - _E4M3_POS[lo]
    d_hi = _E4M3_POS[hi] - mag
    pick_hi = (d_hi < d_lo) | ((d_hi == d_lo) & (hi % 2 == 0))
    code = np.where(pick_hi, hi, lo).astype(np.uint8)
    code = np.where(np.signbit(x) & (code != 0), code | 0x80, code)
    code = np.where(np.isnan(x), 0x7F, code)
    return code.astype(np.uint8)


def e4m3_bits_to_f32(b):
    return _E4M3_DECODE[np.asarray(b, dtype=np.uint8)]


# ---------------------------------------------------------------------------------------------


def encode(values, dtype):
    """Float values -> storage array for the safetensors dtype."""
    if dtype == "F32":
        return np.asarray(values, dtype=np.float32)
    if dtype == "F64":
        return np.asarray(values, dtype=np.float64)
    if dtype == "BF16":
        return f32_to_bf16_bits(np.asarray(values, dtype=np.float32))
    if dtype == "F16":
        return np.asarray(values, dtype=np.float16)
    if dtype == "F8_E4M3":
        return f32_to_e4m3_bits(values)
    raise ValueError(f"cannot encode dtype {dtype}")


def decode(dtype, storage):
    """Storage array -> float32 values (F64 stays float64)."""
    if dtype in ("F32", "F64"):
        return storage
    if dtype == "BF16":
        return bf16_bits_to_f32(storage)
    if dtype == "F16":
        return storage.astype(np.float32)
    if dtype == "F8_E4M3":
        return e4m3_bits_to_f32(storage)
    if dtype in ("I64", "I32"):
        return storage
    raise ValueError(f"cannot decode dtype {dtype}")


def _header_bytes(entries, metadata=None):
    """The length prefix and JSON header of a safetensors file whose tensors are `entries`,
    a list of (name, dtype, shape) in file order."""
    header = {"__metadata__": dict(metadata or {"format": "pt"})}
    offset = 0
    for name, dtype, shape in entries:
        size = math.prod(shape) * _STORAGE[dtype].itemsize
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    # Pad the header with spaces so the data starts 8-byte aligned, as the reference writer does.
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text


def write_safetensors(path, tensors, metadata=None):
    """tensors: ordered dict name -> (dtype, storage array). Writes one .safetensors file."""
    arrays = [(name, dtype, np.ascontiguousarray(arr, dtype=_STORAGE[dtype]))
              for name, (dtype, arr) in tensors.items()]
    with open(path, "wb") as f:
        f.write(_header_bytes([(name, dtype, arr.shape) for name, dtype, arr in arrays], metadata))
        for _, _, arr in arrays:
            f.write(arr.tobytes())


def map_safetensors(path):
    """-> (dict name -> (dtype, storage array), metadata). Arrays are read-only views of a memory
    map of the file: a tensor is read from disk when it is used."""
    if os.path.getsize(path) < 8:
        raise ValueError(f"{path}: too short for a safetensors header")
    raw = np.memmap(path, dtype=np.uint8, mode="r")
    (n,) = struct.unpack("<Q", raw[:8].tobytes())
    if 8 + n > len(raw):
        raise ValueError(f"{path}: header length {n} past end of file")
    header = json.loads(raw[8:8 + n].tobytes().decode("utf-8"))
    metadata = header.pop("__metadata__", {})
    base = 8 + n
    out = {}
    for name, info in header.items():
        dtype = info["dtype"]
        if dtype not in _STORAGE:
            raise ValueError(f"{path}: tensor {name} has unsupported dtype {dtype}")
        begin, end = info["data_offsets"]
        shape = tuple(info["shape"])
        count = math.prod(shape)
        if end - begin != count * _STORAGE[dtype].itemsize or base + end > len(raw):
            raise ValueError(f"{path}: tensor {name} has bad data_offsets {begin},{end}")
        out[name] = (dtype, raw[base + begin:base + end].view(_STORAGE[dtype]).reshape(shape))
    return out, metadata


def read_safetensors(path):
    """-> (dict name -> (dtype, storage array), metadata). Arrays are copies, not views."""
    tensors, metadata = map_safetensors(path)
    return {name: (dtype, np.array(arr)) for name, (dtype, arr) in tensors.items()}, metadata


def shard_file_name(i, n):
    return f"model-{i + 1:05d}-of-{n:05d}.safetensors"


def write_checkpoint(out_dir, tensors, shards=1):
    """Writes model.safetensors, or `shards` files plus model.safetensors.index.json.

    Tensors are dealt to shards round-robin in their order, so a weight and its scale_inv
    usually land in different files: readers must go through the index for every name."""
    os.makedirs(out_dir, exist_ok=True)
    if shards <= 1:
        write_safetensors(os.path.join(out_dir, SINGLE_NAME), tensors)
        return
    parts = [dict() for _ in range(shards)]
    for k, (name, t) in enumerate(tensors.items()):
        parts[k % shards][name] = t
    weight_map = {}
    total = 0
    for i, part in enumerate(parts):
        fname = shard_file_name(i, shards)
        write_safetensors(os.path.join(out_dir, fname), part)
        for name, (dtype, arr) in part.items():
            weight_map[name] = fname
            total += arr.size * _STORAGE[dtype].itemsize
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    with open(os.path.join(out_dir, INDEX_NAME), "w") as f:
        json.dump(index, f, indent=2)


class StreamingCheckpointWriter:
    """Writes the same files as write_checkpoint (byte for byte) one tensor at a time, so that a
    checkpoint larger than memory can be made: the tensor list is given up front as
    (name, dtype, shape) in order, then each tensor's storage is passed in that order, whole
    (add) or as consecutive row blocks (begin, write..., end).

        with StreamingCheckpointWriter(out_dir, specs, shards) as w:
            for name, dtype, arr in produce():
                w.add(name, dtype, arr)
    """

    def __init__(self, out_dir, specs, shards=1):
        self.specs = [(name, dtype, tuple(shape)) for name, dtype, shape in specs]
        self.shards = max(1, shards)
        os.makedirs(out_dir, exist_ok=True)
        self.out_dir = out_dir
        # Round-robin in order, as write_checkpoint deals them.
        self.shard_of = [k % self.shards for k in range(len(self.specs))]
        self.names = ([SINGLE_NAME] if self.shards == 1
                      else [shard_file_name(i, self.shards) for i in range(self.shards)])
        self.files = []
        for i, fname in enumerate(self.names):
            f = open(os.path.join(out_dir, fname), "wb")
            self.files.append(f)
            f.write(_header_bytes([s for s, k in zip(self.specs, self.shard_of) if k == i]))
        self.next = 0
        self.pending = None  # bytes still owed by the tensor begun, or None

    def begin(self, name, dtype):
        if self.pending is not None:
            raise ValueError(f"begin({name}) before the previous tensor ended")
        if self.next >= len(self.specs):
            raise ValueError(f"tensor {name} beyond the {len(self.specs)} announced")
        want_name, want_dtype, shape = self.specs[self.next]
        if (name, dtype) != (want_name, want_dtype):
            raise ValueError(f"got {name} ({dtype}), expected {want_name} ({want_dtype})")
        self.pending = math.prod(shape) * _STORAGE[dtype].itemsize

    def write(self, arr):
        """Appends the next part of the tensor begun (its storage, in row-major order)."""
        dtype = self.specs[self.next][1]
        arr = np.ascontiguousarray(arr, dtype=_STORAGE[dtype])
        if arr.nbytes > self.pending:
            raise ValueError(f"{self.specs[self.next][0]}: more data than its shape holds")
        self.files[self.shard_of[self.next]].write(arr.reshape(-1).view(np.uint8).data)
        self.pending -= arr.nbytes

    def end(self):
        name, _, shape = self.specs[self.next]
        if self.pending != 0:
            raise ValueError(f"{name}: {self.pending} bytes short of shape {shape}")
        self.pending = None
        self.next += 1

    def add(self, name, dtype, arr):
        if tuple(np.shape(arr)) != self.specs[min(self.next, len(self.specs) - 1)][2]:
            raise ValueError(f"{name}: shape {np.shape(arr)} differs from the one announced")
        self.begin(name, dtype)
        self.write(arr)
        self.end()

    def close(self):
        for f in self.files:
            f.close()
        if self.next != len(self.specs):
            raise ValueError(f"only {self.next} of {len(self.specs)} tensors written")
        if self.shards > 1:
            weight_map = {name: self.names[k] for (name, _, _), k in zip(self.specs, self.shard_of)}
            total = sum(math.prod(shape) * _STORAGE[dtype].itemsize for _, dtype, shape in self.specs)
            index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
            with open(os.path.join(self.out_dir, INDEX_NAME), "w") as f:
                json.dump(index, f, indent=2)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.close()
        else:
            for f in self.files:
                f.close()
        return False


def map_checkpoint(model_dir):
    """-> dict name -> (dtype, storage) over model.safetensors or the sharded index, the arrays
    read-only views of memory maps (map_safetensors)."""
    index_path = os.path.join(model_dir, INDEX_NAME)
    if not os.path.exists(index_path):
        return map_safetensors(os.path.join(model_dir, SINGLE_NAME))[0]
    with open(index_path) as f:
        weight_map = json.load(f)["weight_map"]
    out = {}
    for fname in sorted(set(weight_map.values())):
        tensors, _ = map_safetensors(os.path.join(model_dir, fname))
        for name, t in tensors.items():
            if weight_map.get(name) != fname:
                raise ValueError(f"{fname}: tensor {name} not mapped to this file by the index")
            out[name] = t
    missing = set(weight_map) - set(out)
    if missing:
        raise ValueError(f"index names tensors missing from shards: {sorted(missing)[:5]}")
    return out


def read_checkpoint(model_dir):
    """-> dict name -> (dtype, storage) over model.safetensors or the sharded index; copies."""
    return {name: (dtype, np.array(arr)) for name, (dtype, arr) in map_checkpoint(model_dir).items()}


def block_dequant(values, scale_inv, block=128):
    """fp8 values [R, C] times per-block scale_inv [ceil(R/128), ceil(C/128)] -> float64."""
    v = np.asarray(values, dtype=np.float64)
    s = np.asarray(scale_inv, dtype=np.float64)
    expand = np.repeat(np.repeat(s, block, axis=0), block, axis=1)
    return v * expand[: v.shape[0], : v.shape[1]]


def load_float_weights(model_dir):
    """All tensors as float64 numpy arrays; F8_E4M3 weights dequantized with their
    `<name>_scale_inv` block scales (which are then dropped)."""
    raw = read_checkpoint(model_dir)
    out = {}
    for name, (dtype, arr) in raw.items():
        if name.endswith("_scale_inv"):
            continue
        vals = decode(dtype, arr).astype(np.float64)
        if dtype == "F8_E4M3":
            scale_name = name + "_scale_inv"
            if scale_name not in raw:
                raise ValueError(f"fp8 tensor {name} has no {scale_name}")
            sdt, sarr = raw[scale_name]
            vals = block_dequant(vals, decode(sdt, sarr))
        out[name] = vals
    return out
