"""Build the noise upper-bound table on the CPU (a host sweep of all 2^32 hashes) for the GPU jobs to load.

``dspark_markov.cuda.noise_table`` otherwise sweeps the 2^32 hashes on the GPU at the first CUDA Gumbel design of a
fresh machine (~10-20 s of device time per round: rounds start fresh machines). The table depends only on
noise.cuh's exact IEEE operations (``tb_bucket``, ``uniform32``, ``gumbel32``), which are ``__host__ __device__``
and equal the torch reference bit for bit as host C++ (tests/draft/test_cuda_chain.py), so a host sweep gives the
GPU's table. This tool compiles the sweep (g++ -O2 -ffp-contract=off, one thread per core), then checks every bucket
of the hashes below 2^26 against :mod:`dspark_markov.rng`'s torch reference (the GPU test's check,
``test_noise_table_matches_the_torch_reference_noise``) before it writes the file where ``noise_table`` looks for
it (:func:`dspark_markov.cuda.noise_table_path`, under ``$DSPARK_MARKOV_CACHE``). On the GPU,
``test_noise_table_is_the_exhaustive_bucket_maximum`` compares it with a fresh device sweep.

Usage: ``PYTHONPATH=src python tools/prebuild_noise_table.py [DIR]`` (default ``gpu_jobs/cuda_cache``; the sweep took
42 s on 2 cores, the check ~30 s, 2026-12-05).
"""

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SWEEP = r"""
#include "noise.cuh"
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>
using namespace dm;
int main(int argc, char** argv) {
  const int threads = atoi(argv[2]);
  std::vector<std::vector<u32>> words(threads, std::vector<u32>(DM_TB_SIZE, 0u));
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&words, t, threads] {
      const u64 lo = (1ull << 32) * t / threads, hi = (1ull << 32) * (t + 1) / threads;
      std::vector<u32>& w = words[t];
      for (u64 h = lo; h < hi; ++h) {
        const u32 b = tb_bucket((u32)h), o = tb_order(gumbel32(uniform32((u32)h)));
        if (o > w[b]) w[b] = o;
      }
    });
  }
  for (std::thread& thread : pool) thread.join();
  std::vector<float> table(DM_TB_SIZE);
  for (int b = 0; b < DM_TB_SIZE; ++b) {
    u32 best = 0u;
    for (int t = 0; t < threads; ++t) best = words[t][b] > best ? words[t][b] : best;
    table[b] = tb_unorder(best);
  }
  FILE* out = fopen(argv[1], "wb");
  if (!out || fwrite(table.data(), 4, DM_TB_SIZE, out) != (size_t)DM_TB_SIZE) return 1;
  return fclose(out) != 0;
}
"""


def check_low_buckets(table):
    """Every bucket of the hashes below 2^26 recomputed with the torch reference (exponents 0-25 of ``h | 1``)."""
    import torch

    from dspark_markov import cuda, rng

    bits, limit, step = cuda.TB_SIZE // 33, 1 << 26, 1 << 22
    best = torch.full((cuda.TB_SIZE,), float("-inf"))
    for lo in range(0, limit, step):
        h = torch.arange(lo, lo + step, dtype=torch.int64)
        noise = rng.gumbel32(rng.uniform32(h))
        as_float = (h | 1).to(torch.float32)
        bucket = (as_float.view(torch.int32).to(torch.int64) >> (23 - 6)) - (127 << 6)
        best.scatter_reduce_(0, bucket, noise, reduce="amax")
    covered = 26 * bits
    return torch.equal(best[:covered].view(torch.int32), table[:covered].view(torch.int32))


def main(argv) -> int:
    folder = Path(argv[1] if len(argv) > 1 else "gpu_jobs/cuda_cache").resolve()
    os.environ["DSPARK_MARKOV_CACHE"] = str(folder)
    import torch  # noqa: PLC0415

    from dspark_markov import cuda  # noqa: PLC0415
    from dspark_markov.cuda import build  # noqa: PLC0415

    compiler = shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")
    if compiler is None:
        print("prebuild_noise_table: no host C++ compiler", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        source, program, raw = Path(tmp) / "sweep.cpp", Path(tmp) / "sweep", Path(tmp) / "table.f32"
        source.write_text(SWEEP)
        subprocess.run([compiler, "-O2", "-std=c++17", "-ffp-contract=off", "-fno-fast-math", "-pthread",
                        f"-I{build.SOURCE_DIR}", str(source), "-o", str(program)], check=True)
        start = time.time()
        subprocess.run([str(program), str(raw), str(os.cpu_count() or 1)], check=True)
        data = raw.read_bytes()
    table = torch.frombuffer(bytearray(data), dtype=torch.float32)
    print(f"host sweep of 2^32 hashes: {time.time() - start:.0f} s; bucket 0 {float(table[0]):.4f}, "
          f"max {float(table.max()):.4f}")
    if table.numel() != cuda.TB_SIZE or not check_low_buckets(table):
        print("prebuild_noise_table: the table disagrees with the torch reference below 2^26: not written",
              file=sys.stderr)
        return 1
    path = cuda.noise_table_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    print(f"checked against the torch reference below 2^26; written {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
