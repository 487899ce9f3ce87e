#!/usr/bin/python3
"""Compare `moe-serve generate` with the float64 reference on one tiny random checkpoint.

    reference_check.py --binary PATH/moe-serve --config configs/NAME.json [--dtype f32|bf16]
    reference_check.py --reference-only --config configs/NAME.json   # margins, no binary

The config file: {"config": {config.json overrides}, "storage": "f32|bf16|f16|fp8",
"shards": N, "negative_bias": bool, "fixed_routing": bool (optional), "seed": S,
"prompts": [[ids...], ...], "max_tokens": N}.

--dtype f32: token ids identical; every position's top-5 logprobs match the reference's ids and
values within --tol (1e-4); where two alternatives' reference values lie within --tol of each
other their order may differ. The same for mtp_logprobs when the model has an MTP layer.
--dtype bf16: token ids may part from the reference only at a position where the reference's
top-1/top-2 margin is below --margin (0.05); comparison stops there. Logprobs up to that point
must be within --bf16-tol (loose: it catches broken paths, not rounding).
Exit 0 when every prompt passes, 1 otherwise, with a diff of what differed.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tools"))
import make_tiny_checkpoint  # noqa: E402
import reference_forward  # noqa: E402

TOP_K = 5


def run_binary(binary, model_dir, prompt, max_tokens, dtype, mtp, timeout):
    cmd = [binary, "generate", "--model", model_dir,
           "--prompt-ids", ",".join(str(t) for t in prompt),
           "--max-tokens", str(max_tokens), "--temperature", "0", "--logprobs", str(TOP_K)]
    if mtp:
        cmd += ["--mtp-logprobs", str(TOP_K)]
    cmd += ["--dtype", dtype, "--json"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, f"timed out after {timeout}s: {' '.join(cmd)}"
    if proc.returncode != 0:
        return None, (f"exit code {proc.returncode}: {' '.join(cmd)}\n"
                      f"stderr: {proc.stderr.strip()[-2000:]}")
    # The object is the last line that looks like one; anything else is logging.
    for line in reversed(proc.stdout.strip().splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line), None
            except json.JSONDecodeError as e:
                return None, f"bad JSON from binary ({e}): {line[:500]}"
    return None, f"no JSON object on stdout: {' '.join(cmd)}\nstdout: {proc.stdout[-1000:]}"


def fmt_entries(entries):
    return " ".join(f"{e['id']}:{e['logprob']:.6f}" for e in entries)


def ref_top(row, k):
    return reference_forward.top_k_entries(torch.as_tensor(row), k)


def check_topk(got, ref_row, tol, where, worst=None):
    """got: the binary's [{"id","logprob"}] for one position; ref_row: the reference's full
    log-prob vector (numpy). The r-th entry must hold an id whose reference value is within tol
    of the r-th best reference value (so only near-equal alternatives may swap), and its
    reported value must be within tol of the reference's value for that id."""
    k = min(TOP_K, len(ref_row))
    best = np.sort(ref_row)[::-1][:k]
    errors = []
    if not isinstance(got, list) or len(got) != k:
        return [f"{where}: expected {k} entries, got {got!r}"[:400]]
    ids = [e.get("id") if isinstance(e, dict) else None for e in got]
    if len(set(ids)) != k:
        errors.append(f"{where}: repeated ids {ids}")
    for r, e in enumerate(got):
        if not isinstance(e, dict):
            errors.append(f"{where}: bad entry {e!r}")
            continue
        i, lp = e.get("id"), e.get("logprob")
        if not isinstance(i, int) or not 0 <= i < len(ref_row) or not isinstance(lp, (int, float)):
            errors.append(f"{where}: bad entry {e}")
            continue
        if worst is not None:
            worst[0] = max(worst[0], abs(lp - ref_row[i]))
        if abs(ref_row[i] - best[r]) > tol:
            errors.append(f"{where}: rank {r} is id {i} (ref logprob {ref_row[i]:.6f}), "
                          f"reference rank {r} has {best[r]:.6f}")
        elif abs(lp - ref_row[i]) > tol:
            errors.append(f"{where}: id {i} logprob {lp:.6f} vs reference {ref_row[i]:.6f} "
                          f"(diff {abs(lp - ref_row[i]):.2e})")
    if errors:
        errors.append(f"    binary:    {fmt_entries(got)}")
        errors.append(f"    reference: {fmt_entries(ref_top(ref_row, k))}")
    return errors


def margin(row):
    top2 = np.sort(row)[::-1][:2]
    return float(top2[0] - top2[1]) if len(top2) == 2 else float("inf")


def route_note(route, upto):
    """Where tokens part, a near-tie in routing at or before that position is the usual cause
    besides a near-tie in the logits: say how close the reference's routing came."""
    if not np.isfinite(route[:upto + 1]).any():
        return "no routed layers"
    j = int(np.argmin(route[:upto + 1]))
    return f"smallest reference routing gap up to position {upto}: {route[j]:.2e} at position {j}"


def check_f32(out, gen, lps, mtp, tol, route, P, notes):
    errors = []
    worst = [0.0]
    got_ids = out.get("token_ids")
    if got_ids != gen:
        first = next((j for j, (a, b) in enumerate(zip(got_ids or [], gen)) if a != b),
                     min(len(got_ids or []), len(gen)))
        errors.append(f"token_ids differ from position {first}:\n    binary:    {got_ids}\n"
                      f"    reference: {gen}")
        if first < len(lps):
            errors.append(f"    reference top-1/top-2 margin there: {margin(lps[first]):.3e}; "
                          f"{route_note(route, P - 1 + first)}")
    n = min(len(gen), len(got_ids or []))
    got_lp = out.get("logprobs") or []
    if len(got_lp) != len(got_ids or []):
        errors.append(f"logprobs has {len(got_lp)} positions for {len(got_ids or [])} tokens")
    for j in range(min(n, len(got_lp))):
        errors += check_topk(got_lp[j], lps[j], tol, f"logprobs[{j}]", worst)
        if got_ids[j] != gen[j]:
            break  # later positions see different prefixes
    if mtp is not None and not errors:
        got_mtp = out.get("mtp_logprobs")
        if not isinstance(got_mtp, list) or len(got_mtp) != len(mtp):
            errors.append(f"mtp_logprobs: expected {len(mtp)} positions, got "
                          f"{len(got_mtp) if isinstance(got_mtp, list) else got_mtp!r}")
        else:
            for j in range(len(mtp)):
                errors += check_topk(got_mtp[j], mtp[j], tol, f"mtp_logprobs[{j}]", worst)
    notes.append(f"max |logprob - reference| over compared entries: {worst[0]:.2e}")
    return errors


def check_bf16(out, gen, lps, margin_limit, tol, notes, route, P):
    errors = []
    got_ids = out.get("token_ids") or []
    got_lp = out.get("logprobs") or []
    worst = 0.0
    for j in range(max(len(gen), len(got_ids))):
        if j >= len(gen) or j >= len(got_ids):
            errors.append(f"lengths differ (binary {len(got_ids)}, reference {len(gen)}) "
                          f"with equal tokens up to position {j}:\n    binary:    {got_ids}\n"
                          f"    reference: {gen}")
            break
        if j < len(got_lp):
            for e in got_lp[j]:
                if not (isinstance(e, dict) and isinstance(e.get("id"), int)
                        and 0 <= e["id"] < lps.shape[1]
                        and isinstance(e.get("logprob"), (int, float))):
                    errors.append(f"logprobs[{j}]: bad entry {e!r}")
                    continue
                diff = abs(e["logprob"] - lps[j][e["id"]])
                worst = max(worst, diff)
                if diff > tol:
                    errors.append(f"logprobs[{j}]: id {e['id']} {e['logprob']:.4f} vs "
                                  f"reference {lps[j][e['id']]:.4f}")
        if got_ids[j] != gen[j]:
            m = margin(lps[j])
            if m < margin_limit:
                notes.append(f"diverged at position {j} (binary {got_ids[j]}, reference "
                             f"{gen[j]}) where the reference margin is {m:.4f}: stop comparing")
            else:
                errors.append(f"token_ids differ at position {j} with reference margin "
                              f"{m:.4f} >= {margin_limit}:\n    binary:    {got_ids}\n"
                              f"    reference: {gen}\n"
                              f"    binary top:    {fmt_entries(got_lp[j]) if j < len(got_lp) else '-'}\n"
                              f"    reference top: {fmt_entries(ref_top(lps[j], TOP_K))}\n"
                              f"    {route_note(route, P - 1 + j)}")
            break
    notes.append(f"max |logprob - reference| over compared entries: {worst:.4f}")
    return errors


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--binary", help="path to the moe-serve executable")
    ap.add_argument("--config", required=True, help="test case JSON")
    ap.add_argument("--dtype", choices=["f32", "bf16"], default="f32")
    ap.add_argument("--tol", type=float, default=1e-4)
    ap.add_argument("--margin", type=float, default=0.05, help="bf16: allowed divergence margin")
    ap.add_argument("--bf16-tol", type=float, default=0.5, help="bf16: logprob tolerance")
    ap.add_argument("--timeout", type=float, default=300, help="seconds per binary run")
    ap.add_argument("--keep", help="write the checkpoint here and keep it")
    ap.add_argument("--reference-only", action="store_true",
                    help="no binary: print the reference output and its margins")
    args = ap.parse_args()
    if not args.reference_only and not args.binary:
        ap.error("--binary is required unless --reference-only")
    torch.set_num_threads(1)  # the machine is shared; the models are tiny

    with open(args.config) as f:
        case = json.load(f)
    name = os.path.splitext(os.path.basename(args.config))[0]
    tmp = None
    if args.keep:
        model_dir = args.keep
    else:
        tmp = tempfile.TemporaryDirectory(prefix=f"moe_ref_{name}_")
        model_dir = tmp.name
    cfg = make_tiny_checkpoint.make_checkpoint(
        model_dir, case.get("config", {}), case.get("storage", "f32"), case.get("shards", 1),
        case.get("negative_bias", False), case.get("seed", 0),
        fixed_routing=case.get("fixed_routing", False))
    model = reference_forward.Model(model_dir)
    has_mtp = bool(cfg.get("num_nextn_predict_layers"))
    max_tokens = case.get("max_tokens", 16)

    failed = 0
    for n, prompt in enumerate(case["prompts"]):
        label = f"[{name} {args.dtype} prompt {n} ({len(prompt)} tokens)]"
        gen, lps_t, mtp_t = model.generate(prompt, max_tokens, want_mtp=has_mtp)
        lps = lps_t.numpy()
        mtp = mtp_t.numpy() if mtp_t is not None else None
        margins = [margin(r) for r in lps]
        min_m = min(margins) if margins else float("inf")
        route = model.routing_margins(list(prompt) + gen)
        if args.reference_only:
            mtp_m = min(margin(r) for r in mtp) if mtp is not None else None
            mtp_route = model.routing_margins(list(prompt) + gen, mtp=True) if has_mtp else None
            print(f"{label} tokens {gen}\n    min top-1/top-2 margin {min_m:.4f}"
                  f"{'' if mtp_m is None else f', mtp {mtp_m:.4f}'}; "
                  f"margins < 0.05 at {[j for j, m in enumerate(margins) if m < 0.05]}\n"
                  f"    min routing margin {route.min():.5f}"
                  f"{'' if mtp_route is None else f', mtp block {mtp_route.min():.5f}'}")
            continue
        out, err = run_binary(args.binary, model_dir, prompt, max_tokens, args.dtype,
                              has_mtp and args.dtype == "f32", args.timeout)
        errors, notes = [], []
        if err:
            errors.append(err)
        elif not isinstance(out, dict):
            errors.append(f"binary printed {type(out).__name__}, not an object")
        else:
            if out.get("prompt_ids") != list(prompt):
                errors.append(f"prompt_ids {out.get('prompt_ids')} != {prompt}")
            if args.dtype == "f32":
                errors += check_f32(out, gen, lps, mtp, args.tol, route, len(prompt), notes)
            else:
                errors += check_bf16(out, gen, lps, args.margin, args.bf16_tol, notes, route,
                                     len(prompt))
        if errors and isinstance(out, dict) and not any("routing gap" in e for e in errors):
            errors.append(route_note(route, len(route) - 1))
        status = "FAIL" if errors else "ok"
        print(f"{label} {status}: {len(gen)} tokens, min reference margin {min_m:.4f}")
        for line in notes:
            print(f"    note: {line}")
        for line in errors[:40]:
            print(f"    {line}")
        failed += bool(errors)
    if tmp:
        tmp.cleanup()
    if args.reference_only:
        return 0
    print(f"{name}: {len(case['prompts']) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
