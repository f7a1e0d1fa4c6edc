"""EmbeddingBag-with-offsets test cases (imported by generate.py): see its docstring."""
import numpy as np
from onnx import TensorProto, helper, numpy_helper

F, I64 = TensorProto.FLOAT, TensorProto.INT64


def main(save):
    pass
