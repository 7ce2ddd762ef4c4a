"""How fast the GPU starts the programs of one launch: the start ramp the verifier's traces show, without the verifier.

Stop 32-34's traces of the stream verifier (``tools/trace_verify.py``) show its first wave of stream items starting
over ~7 us (H100 and H200, 16 requests: 264 programs of 8 warps at 128 registers), a large part of a ~42 us launch.
This tool launches a kernel that does nothing but read ``%globaltimer`` / ``%smid`` at its first instruction, store
them, and hold its slot for ``hold`` ns (a busy wait on the timer, so a wave stays resident as stream items do), with
the verifier's launch shape (8 warps, a register cap), and prints the start times' distribution: whether the ramp is
the hardware's CTA dispatch or something the verifier does.

Usage (GPU): ``PYTHONPATH=src python3 tools/launch_ramp.py`` -- cases: one wave of 264 programs at 128 registers and
of 396 at 80 (two / three programs per SM on 132 SMs), the same with a cold L2 (flushed first), and 1,280 programs of
which every third holds its slot (the others exit at once, as the lag's padding programs do).
"""

import statistics
import sys

import torch
import triton
import triton.language as tl

from dspark_markov.verify.triton_verify_stream import _clock  # (%globaltimer, %smid), as the verifier's trace reads them


@triton.jit
def _ramp_kernel(out_ptr, hold_ns, EVERY: tl.constexpr):
    """Program ``p`` stores its start time and SM, then (every ``EVERY``-th program) spins ``hold_ns``.
    Bytes: 16 written per program."""
    pid = tl.program_id(0)
    start, sm = _clock(pid, True)
    tl.store(out_ptr + pid * 2, start)
    tl.store(out_ptr + pid * 2 + 1, sm.to(tl.int64))
    if pid % EVERY == 0:
        now = start
        while now - start < hold_ns:
            now, sm = _clock(pid, True)


def ramp(programs: int, registers: int, hold_us: float, every: int = 1, flush=None) -> dict:
    """Start times (us after the first program's) of one launch of ``programs`` 8-warp programs."""
    out = torch.zeros(programs, 2, dtype=torch.int64, device="cuda")
    for _ in range(2):  # compile, then the measured launch
        if flush is not None:
            flush()
        _ramp_kernel[(programs,)](out, int(hold_us * 1000), EVERY=every, num_warps=8, maxnreg=registers)
        torch.cuda.synchronize()
    held = out[::every, 0]
    start = (held - out[:, 0].min()).double() / 1e3
    values = sorted(start.tolist())
    return {"n": len(values), "sms": int(torch.unique(out[:, 1]).numel()), "min": values[0],
            "median": statistics.median(values), "p90": values[int(0.9 * (len(values) - 1))], "max": values[-1]}


def main(argv) -> int:
    if not torch.cuda.is_available():
        print("launch_ramp: needs a GPU")
        return 0
    from dspark_markov.bench import harness  # noqa: PLC0415

    flush = harness.L2Flusher(torch.device("cuda"))
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(torch.cuda.get_device_name(0), "torch", torch.__version__, "triton", triton.__version__, f"{sms} SMs")
    cases = [(2 * sms, 128, 20.0, 1, None), (3 * sms, 80, 20.0, 1, None), (2 * sms, 128, 20.0, 1, flush),
             (3 * sms, 80, 20.0, 1, flush), (2 * sms, 128, 0.0, 1, flush), (1280, 128, 20.0, 3, flush),
             (4 * sms, 128, 20.0, 1, flush)]
    for programs, registers, hold, every, cold in cases:
        r = ramp(programs, registers, hold, every, cold)
        print(f"{programs:5d} programs, {registers:3d} registers, hold {hold:4.1f} us, every {every}"
              f"{', cold L2' if cold else ''}: {r['n']} holding programs on {r['sms']} SMs start at "
              f"{r['min']:.2f} / {r['median']:.2f} / {r['p90']:.2f} / {r['max']:.2f} us (min / median / p90 / max)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
