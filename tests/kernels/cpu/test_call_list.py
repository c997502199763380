"""CallList (kernels/call_list.py): recorded kernel calls made again by one C loop give what the
calls gave from Python, bit for bit, and a call that returns another status than it did stops
the list there."""

import ctypes

import pytest
import torch

from pagedgen.kernels import cpu_ops
from pagedgen.kernels.call_list import CallList, call_list_source, can_list
from pagedgen.kernels.cpu_build import record_calls

pytestmark = pytest.mark.skipif(
    cpu_ops.cpu_ops_error() is not None, reason=f"no CPU ops: {cpu_ops.cpu_ops_error()}"
)


def recorded(run) -> list[tuple]:
    calls: list[tuple] = []
    with record_calls(lambda fn, args, status: calls.append((fn, args, status))):
        run()
    return calls


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_list_recomputes_its_calls_bit_for_bit(dtype):
    torch.manual_seed(0)
    x, residual = torch.randn(5, 96, dtype=dtype), torch.randn(5, 96, dtype=dtype)
    weight, gate_up = torch.randn(96, dtype=dtype), torch.randn(5, 64, dtype=dtype)
    outputs: dict[str, torch.Tensor] = {}

    def run() -> None:  # pointers, int64s, a float (eps), in place and into new tensors
        outputs["normed"] = cpu_ops.rms_norm(x, weight, 1e-5)
        cpu_ops.fused_add_rms_norm(outputs["normed"], residual, weight, 1e-6)
        outputs["act"] = cpu_ops.silu_and_mul(gate_up)

    start = (x.clone(), residual.clone(), gate_up.clone())
    calls = recorded(run)
    assert len(calls) == 3 and all(can_list(fn) for fn, _, _ in calls)
    expected = {name: t.clone() for name, t in outputs.items()}
    expected_residual = residual.clone()
    calls_list = CallList(calls)
    for new_inputs in (start, tuple(torch.randn_like(t) for t in start)):
        for t, value in zip((x, residual, gate_up), new_inputs):
            t.copy_(value)
        for t in outputs.values():
            t.fill_(float("nan"))
        calls_list()
        if new_inputs is start:
            assert all(torch.equal(outputs[n], expected[n]) for n in expected)
            assert torch.equal(residual, expected_residual)
        else:
            eager = cpu_ops.rms_norm(x, weight, 1e-5)
            eager_residual = new_inputs[1].clone()
            cpu_ops.fused_add_rms_norm(eager, eager_residual, weight, 1e-6)
            assert torch.equal(outputs["normed"], eager)
            assert torch.equal(residual, eager_residual)
            assert torch.equal(outputs["act"], cpu_ops.silu_and_mul(gate_up))


def test_a_call_returning_another_status_stops_the_list():
    x, weight, outs = torch.randn(2, 32), torch.randn(32), []
    first, second = recorded(lambda: outs.extend(cpu_ops.rms_norm(x, weight, 1e-6) for _ in "ab"))
    fn, args, _ = first
    for out in outs:
        out.fill_(float("nan"))
    with pytest.raises(RuntimeError, match=r"rms_norm_f32 returned 0 in a CPU graph replay"):
        CallList([first, (fn, args, 7), second])()  # it returns 0, not 7
    assert torch.equal(outs[0], cpu_ops.rms_norm(x, weight, 1e-6)), "the calls before it ran"
    assert outs[1].isnan().all(), "the calls after it did not"


def test_the_loop_calls_each_signature_through_its_prototype():
    p, i32, f32 = ctypes.c_void_p, ctypes.c_int, ctypes.c_float
    source = call_list_source([(p, i32, f32), ()])
    assert "case 0: return ((int (*)(void *, int, float))c->fn)(a[0].p, a[1].i, a[2].f);" in source
    assert "case 1: return ((int (*)(void))c->fn)();" in source
