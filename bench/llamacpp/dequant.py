#!/usr/bin/env python3
"""bench/llamacpp/dequant.py: a copy of a GGUF with every quantized tensor expanded to F32
(gguf-py's dequantizer; metadata copied as is, general.file_type set to ALL_F32), so that llama.cpp
runs the same weights with FP32 activations: what separates its 8-bit activation rounding on a
quantized file from a real difference.

  dequant.py IN.gguf OUT.gguf"""
import sys

import numpy as np
from gguf import GGUFReader, GGUFValueType, GGUFWriter, GGMLQuantizationType
from gguf.quants import dequantize


def main():
    src, dst = sys.argv[1:3]
    r = GGUFReader(src)
    arch = r.fields["general.architecture"].contents()
    w = GGUFWriter(dst, arch)
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name in ("general.architecture",):
            continue
        if name == "general.file_type":
            w.add_uint32(name, 0)  # LLAMA_FTYPE_ALL_F32
            continue
        t = f.types[0]
        if t == GGUFValueType.ARRAY:
            w.add_array(name, f.contents())
        else:
            w.add_key_value(name, f.contents(), t)
    for t in r.tensors:
        a = np.asarray(t.data)
        if t.tensor_type not in (GGMLQuantizationType.F32,):
            a = dequantize(a, t.tensor_type)
        shape = [int(x) for x in reversed(t.shape.tolist())]
        w.add_tensor(t.name, np.ascontiguousarray(a, dtype=np.float32).reshape(shape))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
