"""Profilers of the triton RSSM kernels: where a call's time goes, not how long it takes (that is
`benchmarks.triton_rssm`, whose cases, inputs and launch variants these reuse).

    python -m benchmarks.profile.call_profile        # a replayed call: host, replay alone, GPU work by kernel (CUDA)
    python -m benchmarks.profile.phase_profile CASE  # per-phase work and barrier waits from the kernels' stamps (CUDA)
    python -m benchmarks.profile.host_path           # the host's part of a replayed call (any machine)
    python -m benchmarks.profile.kernel_asm CASE     # the kernels compiled for sm_90: copy widths, registers, spills
                                                     # (any machine)
"""
