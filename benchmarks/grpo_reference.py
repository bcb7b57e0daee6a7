"""A ~100-line single-process GRPO loop on the quickstart's task: the reference oracle for learning quality.

Plain torch + transformers on the same tiny char model, tokenizer, data split and reward as
``hybridflow quickstart`` (built by the same helpers), with none of the framework: its own sampler, its own
loss, its own AdamW.  Run it from a quickstart output directory's warm-up checkpoint and compare held-out
greedy accuracy per step with the framework's run; any gap the hyper-parameters do not explain is the
framework's.

    python benchmarks/grpo_reference.py --model OUT/sft/huggingface --steps 300 --lr 5e-5
"""

from __future__ import annotations

import argparse
import json
import time

import torch


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, help="HF folder of the warmed-up model (quickstart OUT/sft/huggingface)")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--n", type=int, default=8)
    p.add_argument("--lr", type=float, default=5e-5)
    p.add_argument("--grad-clip", type=float, default=1.0)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--agg", choices=["token-mean", "seq-mean-token-mean"], default="token-mean")
    p.add_argument("--drop-zero-std", action="store_true", help="drop groups whose rewards are all equal")
    p.add_argument("--std-norm", type=int, default=1, help="divide advantages by the group std (GRPO) or not")
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--betas", type=float, nargs=2, default=(0.9, 0.999))
    p.add_argument("--show-errors", type=int, default=0, help="print this many wrong greedy answers at the end")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--epochs", type=int, default=1, help="PPO epochs over each batch")
    p.add_argument("--mini-batches", type=int, default=1, help="optimizer steps per epoch (PPO mini-batches)")
    p.add_argument("--clip-ratio", type=float, default=0.2)
    p.add_argument("--optim", choices=["adamw", "sgd"], default="adamw")
    p.add_argument("--adam-eps", type=float, default=1e-8)
    p.add_argument("--sft", action="store_true", help="diagnostic: train on the ground truths (SFT) instead")
    p.add_argument("--eval-every", type=int, default=50)
    p.add_argument("--max-tokens", type=int, default=4)
    args = p.parse_args(argv)

    from transformers import AutoModelForCausalLM, AutoTokenizer
    from hybridflow.quickstart.addition import held_out_rows

    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    tok = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    eos, pad = tok.eos_token_id, tok.pad_token_id
    train, test = held_out_rows(4000, 200, args.seed)

    def encode(rows):  # every prompt is "ab+cd=": one length, no padding needed
        ids = [tok.encode(r["prompt"][0]["content"], add_special_tokens=False) for r in rows]
        return torch.tensor(ids), [r["reward_model"]["ground_truth"] for r in rows]

    @torch.no_grad()
    def generate(prompt_ids, greedy):
        model.eval()
        seq, done = prompt_ids, torch.zeros(len(prompt_ids), dtype=torch.bool)
        for _ in range(args.max_tokens):
            logits = model(input_ids=seq).logits[:, -1].float() / (1.0 if greedy else args.temperature)
            nxt = logits.argmax(-1) if greedy else torch.multinomial(logits.softmax(-1), 1).squeeze(-1)
            nxt = torch.where(done, torch.full_like(nxt, pad), nxt)
            seq = torch.cat([seq, nxt[:, None]], dim=1)
            done |= nxt == eos
        resp = seq[:, prompt_ids.shape[1]:]
        # mask: generated tokens up to and including the first EOS
        after_eos = torch.cumsum((resp == eos).long(), dim=1) - (resp == eos).long()
        return seq, resp, (after_eos == 0).float()

    def score(resp, answers):
        texts = [tok.decode(r.tolist(), skip_special_tokens=True).strip() for r in resp]
        return torch.tensor([float(t == a) for t, a in zip(texts, answers)])

    def evaluate():
        """Greedy held-out accuracy, and the exact probability of the right answer at the sampling temperature
        (the GRPO objective on held-out prompts, with no sampling noise)."""
        ids, answers = encode(test)
        acc = score(generate(ids, greedy=True)[1], answers).mean().item()
        truth = torch.tensor([tok.encode(a, add_special_tokens=False) + [eos] for a in answers])
        with torch.no_grad():
            logits = model(input_ids=torch.cat([ids, truth], 1)).logits[:, ids.shape[1] - 1:-1].float()
            logp = torch.log_softmax(logits / args.temperature, -1).gather(-1, truth[:, :, None]).squeeze(-1)
        return {"acc": acc, "p_right": logp.sum(1).exp().mean().item()}

    if args.optim == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.betas[0])
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay, betas=tuple(args.betas),
                                eps=args.adam_eps)
    gen = torch.Generator().manual_seed(args.seed)
    history = [{"step": 0, **evaluate()}]
    window = []
    print(json.dumps(history[-1]), flush=True)
    cpu0, t0 = time.process_time(), time.perf_counter()
    for step in range(1, args.steps + 1):
        idx = torch.randint(len(train), (args.prompts,), generator=gen).tolist()
        ids, answers = encode([train[i] for i in idx])
        ids = ids.repeat_interleave(args.n, dim=0)
        answers = [a for a in answers for _ in range(args.n)]
        seq, resp, mask = generate(ids, greedy=False)
        if args.sft:  # diagnostic: teacher-forced ground truths instead of samples, advantage 1 (plain SFT)
            resp = torch.tensor([tok.encode(a, add_special_tokens=False) + [eos] for a in answers])
            seq, mask = torch.cat([ids, resp], dim=1), torch.ones(resp.shape)
        r = score(resp, answers).view(args.prompts, args.n)
        window.append((r.mean().item(), (r.std(1) > 0).float().mean().item()))
        adv = r - r.mean(1, keepdim=True) if not args.sft else r
        if args.std_norm and not args.sft:
            adv = adv / (r.std(1, keepdim=True) + 1e-6)
        keep = torch.ones_like(r)
        if args.drop_zero_std:
            keep = (r.std(1, keepdim=True) > 0).float().expand_as(r)
        adv, keep = adv.reshape(-1), keep.reshape(-1)
        mask = mask * keep[:, None]
        model.train()

        def token_logp(rows):
            logits = model(input_ids=seq[rows]).logits[:, ids.shape[1] - 1:-1].float() / args.temperature
            return torch.log_softmax(logits, -1).gather(-1, resp[rows, :, None]).squeeze(-1), logits

        with torch.no_grad():
            old_logp, logits = token_logp(torch.arange(len(seq)))
            ent = -(logits.softmax(-1) * logits.log_softmax(-1)).sum(-1)
        for _ in range(args.epochs):
            for rows in torch.randperm(len(seq), generator=gen).chunk(args.mini_batches):
                logp, _ = token_logp(rows)
                ratio = torch.exp(logp - old_logp[rows])
                a = adv[rows, None]
                per_tok = torch.maximum(-a * ratio, -a * ratio.clamp(1 - args.clip_ratio, 1 + args.clip_ratio))
                m = mask[rows]
                if args.agg == "token-mean":
                    loss = (per_tok * m).sum() / m.sum().clamp(min=1)
                else:
                    seqs = (m.sum(1) > 0).float()
                    loss = ((per_tok * m).sum(1) / m.sum(1).clamp(min=1)).sum() / seqs.sum().clamp(min=1)
                opt.zero_grad()
                loss.backward()
                gn = torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip if args.grad_clip > 0 else float("inf"))
                opt.step()
        if step % args.eval_every == 0 or step == args.steps:
            rec = {"step": step, **evaluate(), "reward": sum(w[0] for w in window) / len(window),
                   "signal": sum(w[1] for w in window) / len(window), "grad_norm": gn.item(),
                   "entropy": ((ent * mask).sum() / mask.sum().clamp(min=1)).item(),
                   "cpu_s": time.process_time() - cpu0, "wall_s": time.perf_counter() - t0}
            history.append(rec)
            window = []
            print(json.dumps(rec), flush=True)
    if args.show_errors:
        ids, answers = encode(test)
        resp = generate(ids, greedy=True)[1]
        wrong = [(tok.decode(i), a, tok.decode(r)) for i, a, r in zip(ids, answers, resp) if tok.decode(r, skip_special_tokens=True).strip() != a]
        for w in wrong[: args.show_errors]:
            print("wrong:", w)
    return {"args": vars(args), "history": history}


if __name__ == "__main__":
    main()
