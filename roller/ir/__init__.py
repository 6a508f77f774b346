"""Tensor-expression IR: op.json in, checked TensorExpr out, with the region queries construction needs."""
from roller.ir.expr import Affine, AxisValue, BinOp, Call, Const, Neg, Read
from roller.ir.opfile import OpLike, load_op, load_ops, parse_ops
from roller.ir.tensor_expr import DTYPE_BYTES, Axis, TensorDecl, TensorExpr, View

__all__ = ["DTYPE_BYTES", "Affine", "Axis", "AxisValue", "BinOp", "Call", "Const", "Neg", "OpLike", "Read",
           "TensorDecl", "TensorExpr", "View", "load_op", "load_ops", "parse_ops"]
