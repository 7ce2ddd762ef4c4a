"""The ``dspark-markov`` console script: ``demo``, ``bench`` and ``info``.

Subcommand modules are imported only when their subcommand runs, so ``dspark-markov --help`` and
``dspark-markov info`` work on a machine without Triton or a GPU.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# name -> (module with a ``main(argv) -> int``, one-line help); ``info`` is implemented here.
_DELEGATED = {
    "demo": ("dspark_markov.demo", "run the end-to-end demo (draft, verify, check the output distribution)"),
    "bench": ("dspark_markov.bench.cli", "benchmark the draft-sampler implementations"),
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dspark-markov",
        description="DSpark sequential Markov draft sampling: exact PyTorch reference, Triton samplers.",
        epilog="Arguments after a subcommand go to it: `dspark-markov bench --help`.",
    )
    parser.add_argument("--version", action="store_true", help="print the package version and exit")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_, help_text) in _DELEGATED.items():
        # add_help=False: `dspark-markov demo --help` is answered by the demo's own parser.
        commands.add_parser(name, help=help_text, add_help=False)
    commands.add_parser("info", help="print versions, the device and the available implementations")
    return parser


def _version(module_name: str) -> str:
    try:
        module = importlib.import_module(module_name)
    except Exception as error:  # noqa: BLE001 - any import failure means "not usable here"
        return f"not available ({type(error).__name__}: {error})"
    return str(getattr(module, "__version__", "unknown"))


def _impl_status(impl: str) -> str:
    """Whether ``impl`` can run here (its module and dependencies import), and if not how to enable it."""
    import torch

    from . import registry

    try:
        cls = registry.load("draft", impl)
    except ValueError as error:
        reason = str(error).split("(", 1)[-1].rstrip(")")
        if "triton" in reason.lower():
            return f"unavailable: {reason}; enable with: pip install 'dspark-markov[triton]'"
        return f"unavailable: {reason}"
    why_not = getattr(cls, "unavailable_reason", None)  # designs that need more than an import (cuda_chain)
    reason = why_not() if why_not is not None else None
    if reason is not None:
        return f"unavailable: {reason}"
    devices = ", ".join(getattr(cls, "DEVICES", ()))
    methods = ", ".join(getattr(cls, "METHODS", ()))
    status = f"available (devices: {devices}; methods: {methods})"
    if impl != "reference" and not torch.cuda.is_available():
        if "cpu" not in getattr(cls, "DEVICES", ()):
            return f"{status}; needs a CUDA GPU, none here"
        from .validate import check_triton_runs

        try:
            check_triton_runs(impl, "cpu")
        except ValueError:
            return f"{status}; on this CPU only in Triton's interpreter: set TRITON_INTERPRET=1 (slow, for tests)"
    return status


def info(out=None) -> int:
    """Print the package, torch and Triton versions, the device and each implementation's status."""
    import torch

    from ._version import __version__
    from .registry import names

    out = out or sys.stdout
    print(f"dspark-markov {__version__}", file=out)
    print(f"python        {sys.version.split()[0]}", file=out)
    print(f"torch         {torch.__version__}", file=out)
    print(f"triton        {_version('triton')}", file=out)
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        device = f"cuda:0 {props.name} ({props.total_memory / 2**30:.0f} GiB), CUDA {torch.version.cuda}"
    else:
        device = "cpu (no CUDA GPU; Triton implementations run in the interpreter with TRITON_INTERPRET=1)"
    print(f"device        {device}", file=out)
    print("implementations (impl=):", file=out)
    for impl in names("draft"):
        if impl == "auto":
            status = "picks an implementation from the committed benchmarks (reference on CPU)"
        else:
            status = _impl_status(impl)
        print(f"  {impl:<13} {status}", file=out)
    from .verify import cuda_filtering

    reason = cuda_filtering.unavailable_reason()
    up_to, p_alone = cuda_filtering.AUTO_MAX_ROWS, cuda_filtering.AUTO_MAX_ROWS_P_ALONE
    alone = "any batch" if p_alone is None else f"{p_alone} rows"
    print(f"top-k / top-p (top_k_top_p impl=): reference, triton (auto on CUDA with top-k beyond {up_to} rows), cuda "
          f"(auto up to {up_to} rows with top-k, {alone} with top-p alone, and for temperature=): "
          + ("available" if reason is None else f"unavailable: {reason}"), file=out)
    from .verify import cuda_verify

    reason = cuda_verify.unavailable_reason()
    print("verification (verify_drafts impl=): reference, triton (auto on CUDA), cuda (CudaVerifier, "
          "verify/cuda_verify.py; standard method, opt-in, slower than triton so far): "
          + ("available" if reason is None else f"unavailable: {reason}"), file=out)
    return 0


def main(argv=None) -> int:
    """Entry point of ``dspark-markov``; returns the process exit status.

    Parameters
    ----------
    argv : list of str, the arguments after the program name (default: ``sys.argv[1:]``).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _parser()
    # Split at the subcommand so that everything after it reaches the delegated parser untouched.
    if argv and argv[0] in _DELEGATED:
        module_name = _DELEGATED[argv[0]][0]
        try:
            module = importlib.import_module(module_name)
        except ImportError as error:  # a missing optional dependency (Triton, matplotlib) or module
            print(f"dspark-markov {argv[0]}: cannot import {module_name}: {error}", file=sys.stderr)
            return 1
        try:
            return int(module.main(argv[1:]) or 0)
        except ValueError as error:  # a bad argument that reached the package: one line, usage-error status
            print(f"dspark-markov {argv[0]}: {error}", file=sys.stderr)
            return 2
        except (MemoryError, RuntimeError) as error:  # sizes the machine cannot hold: one line, not a traceback
            import torch  # noqa: PLC0415  (loaded by the subcommand already)

            if not isinstance(error, (MemoryError, torch.OutOfMemoryError)) and "allocate" not in str(error):
                raise
            print(f"dspark-markov {argv[0]}: not enough memory for these sizes (make --vocab / --rank / --requests / "
                  f"--rows / --steps / --length smaller): {str(error).splitlines()[0][:200]}", file=sys.stderr)
            return 1
    args = parser.parse_args(argv)  # exits 2 with a message for an unknown subcommand
    if args.version:
        from ._version import __version__

        print(f"dspark-markov {__version__}")
        return 0
    if args.command == "info":
        return info()
    parser.print_help(sys.stderr)  # no subcommand: a usage error
    return 2


if __name__ == "__main__":
    sys.exit(main())
