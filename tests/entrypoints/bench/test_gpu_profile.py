"""The GPU profile of `pagedgen bench --device cuda`: the interval, launch and host-section
arithmetic on synthetic profiler events, the report lines and the decode roofline (the engine
runs under the profiler in test_profile_steps)."""

import json

import pytest
import torch

from pagedgen.entrypoints.bench.decode_bound import (
    decode_bound,
    decode_bound_line,
    hbm_peak_bytes_per_s,
)
from pagedgen.entrypoints.bench.gpu_profile import (
    STEP_ANNOTATION,
    GpuProfile,
    ProfiledEvent,
    busy_time,
    covered,
    event_kind,
    kernel_label,
    kernel_times,
    launch_kind,
    merge,
    summarize,
)
from pagedgen.entrypoints.bench.report import gpu_profile_line


def test_merge_unions_overlapping_nested_and_touching_intervals():
    assert merge([]) == []
    assert merge([(5, 6), (0, 2), (1, 3)]) == [(0, 3), (5, 6)]  # overlap, out of order
    assert merge([(0, 10), (2, 3), (4, 5)]) == [(0, 10)]  # nested
    assert merge([(0, 1), (1, 2)]) == [(0, 2)]  # touching
    assert merge([(0, 1), (2, 3)]) == [(0, 1), (2, 3)]  # disjoint


def test_covered_clips_to_the_window():
    merged = [(0, 3), (5, 6), (8, 20)]
    assert covered(merged, (1, 10)) == 2 + 1 + 2
    assert covered(merged, (3, 5)) == 0  # a gap, bounded by two intervals
    assert covered(merged, (9, 10)) == 1  # inside one interval that starts before the window
    assert covered(merged, (21, 30)) == 0 and covered(merged, (-5, -1)) == 0
    assert covered(merged, (4, 4)) == 0  # empty window
    assert covered([], (0, 10)) == 0


def test_busy_time_counts_concurrent_streams_once():
    device = [(0, 4), (2, 6), (3, 5), (10, 12)]  # two streams overlapping, one nested
    assert busy_time(device, [(0, 10)]) == 6
    assert busy_time(device, [(0, 3), (5, 11)]) == 3 + 1 + 1
    assert busy_time(device, []) == 0 and busy_time([], [(0, 10)]) == 0


@pytest.mark.parametrize(
    "name, kind",
    [
        ("cudaLaunchKernel", "kernel"),
        ("cudaLaunchKernel_v7000", "kernel"),
        ("cudaLaunchKernel_ptsz_v7000", "kernel"),
        ("cudaLaunchKernelExC", "kernel"),
        ("cudaLaunchKernelExC_v11060", "kernel"),
        ("cuLaunchKernel", "kernel"),
        ("cuLaunchKernelEx", "kernel"),
        ("cudaGraphLaunch", "graph"),
        ("cudaGraphLaunch_v10000", "graph"),
        ("cuGraphLaunch", "graph"),
        ("cudaMemcpyAsync", None),
        ("cudaStreamSynchronize", None),
        ("cudaLaunchHostFunc", None),
        ("aten::mm", None),
    ],
)
def test_launch_kind(name, kind):
    assert launch_kind(name) == kind


def _event(name: str, kind: str, start: float, end: float) -> ProfiledEvent:
    return ProfiledEvent(name, kind, start * 1e6, end * 1e6)  # ms in, ns as kineto gives them


class _OldKinetoEvent:
    """A raw event as torch < 2.12 gives it: no activity_type()."""

    def __init__(self, name: str, on_device: bool, annotation: bool = False):
        self._name, self._on_device, self._annotation = name, on_device, annotation

    def name(self) -> str:
        return self._name

    def device_type(self) -> torch._C._autograd.DeviceType:
        return (
            torch._C._autograd.DeviceType.CUDA
            if self._on_device
            else torch._C._autograd.DeviceType.CPU
        )

    def is_user_annotation(self) -> bool:
        return self._annotation


@pytest.mark.parametrize(
    ("name", "on_device", "annotation", "kind"),
    [
        ("pagedgen::step#3", False, True, "user_annotation"),
        ("pagedgen::step#3", True, True, "gpu_user_annotation"),
        ("paged_attention_v1_kernel", True, False, "kernel"),
        ("Memcpy HtoD (Pinned -> Device)", True, False, "gpu_memcpy"),
        ("Memset (Device)", True, False, "gpu_memset"),
        ("Stream Sync", True, False, "cuda_sync"),
        ("cuLaunchKernel", False, False, "cuda_runtime"),
        ("cudaGraphLaunch_v10000", False, False, "cuda_runtime"),
        ("cudaStreamSynchronize", False, False, "cpu_op"),
        ("aten::mm", False, False, "cpu_op"),
    ],
)
def test_event_kind_without_activity_type(name, on_device, annotation, kind):
    assert event_kind(_OldKinetoEvent(name, on_device, annotation)) == kind


def test_summarize_counts_only_inside_the_decode_steps():
    step = STEP_ANNOTATION
    events = [
        _event(f"{step}0", "user_annotation", 0, 10),  # the warm-up: not a decode step here
        _event(f"{step}1", "user_annotation", 10, 20),
        _event(f"{step}2", "user_annotation", 20, 30),  # a prefill step
        _event(f"{step}3", "user_annotation", 30, 40),
        # the same annotations on the GPU timeline, and a sync: device events, never busy time
        _event(f"{step}1", "gpu_user_annotation", 10, 20),
        _event("cudaStreamSynchronize", "cuda_sync", 30, 40),
        _event("cudaLaunchKernel", "cuda_runtime", 1, 1.1),  # warm-up: not counted
        _event("cudaLaunchKernel", "cuda_runtime", 11, 11.1),
        _event("cuLaunchKernel", "cuda_driver", 12, 12.1),
        _event("cudaMemcpyAsync", "cuda_runtime", 13, 13.1),
        _event("cudaLaunchKernel", "cuda_runtime", 21, 21.1),  # the prefill step's
        _event("cudaGraphLaunch", "cuda_runtime", 31, 31.1),
        _event("cudaLaunchKernel", "cpu_op", 32, 33),  # a host op of that name is no launch
        _event("cudaEventSynchronize", "cuda_runtime", 16, 18.5),  # the host waits 2.5 ms
        _event("cudaStreamSynchronize_v3020", "cuda_runtime", 25, 26),  # in the prefill step
        _event("gemm", "kernel", 11, 15),
        _event("attention", "kernel", 14, 16),  # overlaps gemm on another stream
        _event("Memcpy HtoD", "gpu_memcpy", 19, 22),  # spans a step boundary: 1 ms in step 1
        _event("Memset", "gpu_memset", 31, 32),
        _event("aten::mm", "cpu_op", 10, 40),
        # host sections: step 1's scheduler and forward, the prefill step's forward (left out),
        # a forward of step 3 that runs past it, and an annotation that is no section
        _event("pagedgen::scheduler", "user_annotation", 10, 11),
        _event("pagedgen::model_forward", "user_annotation", 11, 14),
        _event("pagedgen::model_forward", "user_annotation", 21, 29),
        _event("pagedgen::model_forward", "user_annotation", 38, 42),
        _event("pagedgen::mystery", "user_annotation", 30, 40),
    ]
    names = {f"{step}1", f"{step}3"}
    profile = summarize(events, names, device_traced=True)
    assert [part for part, _ in profile.host_s] == ["scheduler", "model_forward"]
    assert dict(profile.host_s) == pytest.approx({"scheduler": 0.001, "model_forward": 0.005})
    assert profile.num_steps == 2
    assert profile.window_s == pytest.approx(0.020)
    assert profile.busy_s == pytest.approx((5 + 1 + 1) / 1000)
    assert profile.busy_perc == pytest.approx(35.0)
    assert (profile.num_kernel_launches, profile.num_graph_launches) == (2, 1)
    assert profile.sync_wait_s == pytest.approx(0.0025)
    assert [label for label, _ in profile.kernel_s] == ["gemm", "attention"]  # most time first
    assert dict(profile.kernel_s) == pytest.approx({"gemm": 0.004, "attention": 0.002})
    figures = profile.to_dict()
    assert figures["kernel_launches_per_step"] == 1.0 and figures["graph_launches_per_step"] == 0.5
    assert json.loads(json.dumps(figures)) == figures

    untraced = summarize(events, names, device_traced=False)
    assert untraced.busy_s is None and untraced.busy_perc is None
    assert untraced.num_kernel_launches == 2
    assert gpu_profile_line(untraced.to_dict()) == (
        "GPU profile: torch.profiler traced no device activity over 2 decode steps "
        "(is CUPTI available?)"
    )


def test_summarize_with_no_decode_step():
    events = [_event("gemm", "kernel", 0, 1), _event("cudaLaunchKernel", "cuda_runtime", 0, 1)]
    profile = summarize(events, set(), device_traced=True)
    assert profile == GpuProfile(0, 0.0, 0.0, 0, 0)
    figures = profile.to_dict()
    assert figures["busy_perc"] is None and figures["kernel_launches_per_step"] is None
    assert gpu_profile_line(figures) == "GPU profile: no decode step ran in the profiled window"


def test_kernel_times_clip_to_the_steps_and_group_by_name():
    windows = [(10e6, 20e6), (30e6, 40e6)]  # ns
    name = "void pagedgen::paged_attention_v1_kernel<__nv_bfloat16, 128>(float*, int)"
    events = [
        _event(name, "kernel", 12, 14),
        _event(name.replace("128", "64"), "kernel", 31, 32),  # another instantiation
        _event("void at::(anonymous namespace)::softmax<float>(float*)", "kernel", 18, 23),
        _event("nvjet_hsh_128x256_64x4_2x1_v_bz", "kernel", 5, 9),  # outside every step
        _event("Memcpy HtoD", "gpu_memcpy", 12, 20),
    ]
    times = kernel_times(events, windows)
    assert [label for label, _ in times] == ["pagedgen::paged_attention_v1_kernel", "at::softmax"]
    assert dict(times) == pytest.approx(
        {"pagedgen::paged_attention_v1_kernel": 0.003, "at::softmax": 0.002}
    )
    assert kernel_times(events, windows, top=1)[0][0] == "pagedgen::paged_attention_v1_kernel"
    assert kernel_label("nvjet_hsh_128x256_64x4_2x1_v_bz") == "nvjet_hsh_128x256_64x4_2x1_v_bz"


def test_gpu_profile_line():
    profile = GpuProfile(32, 0.4, 0.1096, 32 * 3530, 0)
    assert gpu_profile_line(profile.to_dict()) == (
        "GPU busy 27.4 % over 32 decode steps (400.0 ms, under torch.profiler); "
        "3,530 kernel launches a step (0 graph replays); "
        "the host waited for the device 0.0 % of them"
    )
    kernels = (("nvjet_gemm", 0.064), ("softmax", 0.0032))
    timed = GpuProfile(32, 0.4, 0.1096, 32 * 6, 32, kernels, sync_wait_s=0.1)
    lines = gpu_profile_line(timed.to_dict()).splitlines()
    assert lines[0].endswith("(1 graph replays); the host waited for the device 25.0 % of them")
    assert lines[1:] == [
        "     2.000 ms/step  16.0 %  nvjet_gemm",
        "     0.100 ms/step   0.8 %  softmax",
    ]
    # unprofiled, the steps take 5 ms: the device's 3.425 ms a step is 68.5 % of that
    plain = timed._replace(plain_step_s=0.005).to_dict()
    assert plain["plain_busy_perc"] == pytest.approx(68.5)
    assert (
        gpu_profile_line(plain)
        .splitlines()[0]
        .endswith(
            "(1 graph replays); 68.5 % of their 5.00 ms a step unprofiled; "
            "the host waited for the device 25.0 % of them"
        )
    )
    fast = timed._replace(plain_step_s=0.001)  # device work spills past a step's wall time
    assert fast.plain_busy_perc == 100.0
    assert timed.plain_busy_perc is None and GpuProfile(0, 0.0, None, 0, 0).plain_busy_perc is None
    host = (("scheduler", 0.016), ("model_forward", 0.0032))
    mixed = timed._replace(host_s=host, phase="mixed").to_dict()
    lines = gpu_profile_line(mixed).splitlines()
    assert lines[0].startswith("GPU busy 27.4 % over 32 mixed steps (400.0 ms")
    assert lines[-1] == "  host ms/step: scheduler 0.50, model_forward 0.10"


def test_decode_bound_weighs_the_steps_against_their_bytes():
    # 4 steps of 20 ms reading 1,000 context tokens each, an 8B model's 16 GB at 3.2 TB/s
    profile = GpuProfile(4, 0.08, 0.07, 0, 4, kv_tokens=4 * 1000)
    bound = decode_bound(profile, 16e9, 131072, 3.2e12)
    assert bound["step_ms"] == pytest.approx(20.0)
    assert bound["kv_gb_per_step"] == pytest.approx(0.131072)
    assert bound["bound_ms"] == pytest.approx((16e9 + 131072e3) / 3.2e12 * 1000)
    assert bound["ratio"] == pytest.approx(20.0 / bound["bound_ms"])
    assert decode_bound_line(bound) == (
        "decode steps 20.00 ms (under torch.profiler) against 5.04 ms to move their bytes "
        "(16.00 GB of weights + 0.13 GB of K/V a step at 3,200 GB/s): 3.97x"
    )
    assert bound["plain_step_ms"] is None and bound["plain_ratio"] is None
    # the same steps unprofiled: 10.08 ms each, twice the bound
    plain = decode_bound(profile._replace(plain_step_s=0.01008), 16e9, 131072, 3.2e12)
    assert plain["plain_ratio"] == pytest.approx(10.08 / plain["bound_ms"])
    assert decode_bound_line(plain).endswith("3.97x; unprofiled 10.08 ms: 2.00x")
    assert decode_bound(GpuProfile(0, 0.0, None, 0, 0), 16e9, 131072, 3.2e12) is None
    assert "floor" not in decode_bound_line(plain)


def test_decode_bound_floors_compute_bound_matmuls():
    """256 rows a step of a model of 16 GFLOP a token at 800 TFLOP/s: its matmuls take 5.12 ms,
    longer than its weights' 5 ms of bytes, and the K/V reads come after them."""
    profile = GpuProfile(4, 0.08, 0.07, 0, 4, kv_tokens=4 * 1000, num_tokens=4 * 256)
    bound = decode_bound(profile._replace(plain_step_s=0.01), 16e9, 131072, 3.2e12, 16e9, 800e12)
    assert bound["matmul_tflop_per_step"] == pytest.approx(16e9 * 256 / 1e12)
    assert bound["floor_ms"] == pytest.approx(5.12 + 131072e3 / 3.2e12 * 1000)
    assert bound["floor_ratio"] == pytest.approx(20.0 / bound["floor_ms"])
    assert bound["plain_floor_ratio"] == pytest.approx(10.0 / bound["floor_ms"])
    assert bound["ratio"] == pytest.approx(20.0 / 5.04096)  # the bytes bound is unchanged
    assert decode_bound_line(bound).splitlines()[1] == (
        "against their floor, 5.16 ms (matmuls 4.10 TFLOP a step at the measured 800 TFLOP/s or "
        "their weights' bytes, whichever is longer, then the K/V bytes): 3.88x; unprofiled 1.94x"
    )
    # 8 rows a step: the weights' bytes take longer than the matmuls' arithmetic
    small = decode_bound(profile._replace(num_tokens=4 * 8), 16e9, 131072, 3.2e12, 16e9, 800e12)
    assert small["floor_ms"] == pytest.approx(5.0 + 131072e3 / 3.2e12 * 1000)
    assert hbm_peak_bytes_per_s(torch.device("cpu")) is None
