"""The benchmark peer's setup, printed by every PyTorch comparison script: torch's version and
thread count, the BLAS library torch reaches (through libblas.so.3) with its threading layer and
thread count; and the language-model step loop every Hugging Face peer times. Invariant: it
reports what is loaded in this process, never what should be.
"""
import os


def peer_setup():
    """A dict of the peer's setup; call after torch.set_num_threads."""
    import torch  # here, so that openblas_coretype needs no torch
    torch.ones(2, 2) @ torch.ones(2, 2)  # loads the BLAS behind torch
    setup = {"torch": torch.__version__, "torch_threads": torch.get_num_threads(),
             "blas": "unknown", "blas_threading": "unknown", "blas_threads": None,
             "blas_kernels": "unknown"}
    try:
        import threadpoolctl
        for pool in threadpoolctl.threadpool_info():
            if pool.get("user_api") == "blas":
                setup["blas"] = "{} {} ({})".format(pool.get("internal_api"),
                                                    pool.get("version") or "",
                                                    os.path.basename(pool.get("filepath", "")))
                setup["blas_threading"] = pool.get("threading_layer", "unknown")
                setup["blas_threads"] = pool.get("num_threads")
                setup["blas_kernels"] = pool.get("architecture", "unknown")
                break
    except ImportError:
        setup["blas"] = "unknown (install python3-threadpoolctl)"
    return setup


def describe(setup):
    """One line: 'peer: torch 1.13.0a0 (2 threads), BLAS openblas 0.3.21 (...), openmp, 2 threads'."""
    return "peer: torch {} ({} threads), BLAS {}, {} threading, {} threads, {} kernels".format(
        setup["torch"], setup["torch_threads"], setup["blas"], setup["blas_threading"],
        setup["blas_threads"], setup["blas_kernels"])


def openblas_coretype():
    """OPENBLAS_CORETYPE for a CPU OpenBLAS 0.3.21 does not recognise (a virtual machine's
    masked model: it falls back to its Prescott kernels, a third of the speed here): SkylakeX
    with AVX-512, Haswell with AVX2, else None (let OpenBLAS choose)."""
    try:
        flags = next(line for line in open("/proc/cpuinfo") if line.startswith("flags")).split()
    except (OSError, StopIteration):
        return None
    if "avx512f" in flags:
        return "SkylakeX"
    if "avx2" in flags:
        return "Haswell"
    return None


def time_lm_steps(model, vocab, batch, seq, warmup, steps, autocast=False):
    """Seconds of each timed AdamW step (after `warmup` untimed ones) of a causal LM on random
    tokens: zero_grad, forward, cross-entropy, backward, step."""
    import time

    import torch
    import torch.nn.functional as F
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randint(0, vocab, (batch, seq))
    y = torch.randint(0, vocab, (batch, seq))
    times = []
    for step in range(warmup + steps):
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            logits = model(x).logits
        loss = F.cross_entropy(logits.float().reshape(-1, vocab), y.reshape(-1))
        loss.backward()
        opt.step()
        if step >= warmup:
            times.append(time.perf_counter() - start)
    return times
