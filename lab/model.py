"""The lab's decoder-only transformer, written so that its attention is phasekv's maths.

Architecture (the Qwen3 family, shrunk): token embedding (tied to the output head), L blocks of
  x += Wo · attention(RMSNorm(x)),   x += W_down · (silu(W_gate · n) ⊙ W_up · n),  n = RMSNorm(x)
then a final RMSNorm and the logits E · x. RMSNorm(x) = x · rsqrt(mean(x²) + eps) · w. GQA:
query head h reads KV head h // (Hq / Hkv). RoPE: half-split pairs (k, k + d/2) over the whole
head, θ_k = base^(−2k/d), a' = a·cos(pθ) − b·sin(pθ), b' = a·sin(pθ) + b·cos(pθ)
(phasekv::rope_layout::half_split with rope.channels = head_dim).

Attention kinds (every layer of a model has the same kind):

  full     causal attention over every token ≤ t (the control). phasekv runs it as its dense
           control: S = W = 1, mean pooling, RoPE after pooling at the anchor j = t, no window.
  gated    chunked compression, stride S, window W ∈ {S, 2S}: a key stream and a value stream,
           each with its own per-branch projections (payload x_b = C_b·n, gate logits
           z_b = Z_b·n, b = branch, DeepSeek-V4's layout) and a per-slot bias. Entry j pools the
           tokens [(j+1)S − W, (j+1)S) (slots whose token is negative are padding, excluded):
             slot i reads branch b(i) = floor((W − 1 − i) / S) of its token,
             α_{j,i} = softmax_i(z_{b(i)}(t_i) + bias_i)   per channel (vector gates),
             K̂_j = Σ_i α_{j,i} ⊙ x_{b(i)}(t_i);
           keys are then rotated by RoPE at the anchor j·S (block start), values are not.
           A query at t attends to entries j < floor((t + 1) / S) and to the raw window tokens
           [t − N_win + 1, t] (keys W_k·n RoPE'd at their own positions, values W_v·n) in one
           softmax with logits q·k / sqrt(d).
  mean     the same with uniform weights over the real slots (no gate projections, no bias).
  norope   gated, with no RoPE anywhere (queries, window keys and entries; a NoPE model).

phasekv equivalents (lab/host/lab_model.hpp): keys compressor_policy<vector_gated_pool,
rope_after_pool>, values compressor_policy<vector_gated_pool>, per_branch inputs laid out
[token][kv_heads][branches][head_dim], slot_bias [kv_heads][W][head_dim], geometry
{S, W, origin 0, anchor block_start}; paged_cache with raw window N_win; sparse_reader with
top_k = 0 (every complete entry), separate key and value streams.
"""

import math
from dataclasses import dataclass, asdict

import torch
import torch.nn as nn
import torch.nn.functional as F

KINDS = ("full", "gated", "mean", "norope")


@dataclass(frozen=True)
class ModelConfig:
    kind: str = "gated"
    vocab: int = 145
    dim: int = 64
    layers: int = 2
    q_heads: int = 4
    kv_heads: int = 1
    head_dim: int = 16
    ffn: int = 192
    stride: int = 8
    window: int = 8
    win_tokens: int = 16       # N_win, the raw local window (0 for full attention)
    rope_base: float = 10000.0
    norm_eps: float = 1e-6

    def validate(self):
        if self.kind not in KINDS:
            raise ValueError(f"model.kind must be one of {KINDS}, got {self.kind!r}")
        if self.q_heads % self.kv_heads:
            raise ValueError("model.q_heads must be a multiple of model.kv_heads")
        if self.head_dim % 2:
            raise ValueError("model.head_dim must be even (RoPE pairs)")
        if self.kind == "full":
            if (self.stride, self.window, self.win_tokens) != (1, 1, 0):
                raise ValueError("full attention is stride 1, window 1, no raw window")
        elif not (self.window >= self.stride >= 1 and self.win_tokens >= 1):
            raise ValueError("compressed kinds need window >= stride >= 1 and win_tokens >= 1")

    @property
    def branches(self):
        return (self.window + self.stride - 1) // self.stride

    @property
    def gated(self):
        return self.kind in ("gated", "norope")

    @property
    def rope(self):
        return self.kind != "norope"

    def to_dict(self):
        return asdict(self)


def rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope_tables(positions, dim, base):
    """cos, sin of p·θ_k for the given positions: [len(positions), dim/2], formed in double."""
    k = torch.arange(dim // 2, dtype=torch.float64)
    inv = base ** (-2.0 * k / dim)
    ang = positions.to(torch.float64)[:, None] * inv[None, :]
    return torch.cos(ang).float(), torch.sin(ang).float()


def apply_rope(x, cos, sin):
    """Half-split RoPE on the last dim of x [..., P, d] with cos/sin [P, d/2]."""
    h = x.shape[-1] // 2
    a, b = x[..., :h], x[..., h:]
    return torch.cat((a * cos - b * sin, a * sin + b * cos), dim=-1)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        d, hq, hkv, dh = cfg.dim, cfg.q_heads, cfg.kv_heads, cfg.head_dim
        self.wq = nn.Linear(d, hq * dh, bias=False)
        self.wo = nn.Linear(hq * dh, d, bias=False)
        if cfg.kind != "full":
            self.wk = nn.Linear(d, hkv * dh, bias=False)   # raw window keys
            self.wv = nn.Linear(d, hkv * dh, bias=False)   # raw window values
        nb = cfg.branches
        # Compressor payload projections, output features ordered [kv_head][branch][channel].
        self.ck = nn.Linear(d, hkv * nb * dh, bias=False)
        self.cv = nn.Linear(d, hkv * nb * dh, bias=False)
        if cfg.gated:
            self.zk = nn.Linear(d, hkv * nb * dh, bias=False)
            self.zv = nn.Linear(d, hkv * nb * dh, bias=False)
            self.bias_k = nn.Parameter(torch.zeros(hkv, cfg.window, dh))
            self.bias_v = nn.Parameter(torch.zeros(hkv, cfg.window, dh))
        self._index_cache = {}

    # --- the write path -----------------------------------------------------------------------
    def slot_index(self, T, device):
        """Flat row index into [T·branches] of every (entry, slot), and the padding mask."""
        key = (T, device)
        if key not in self._index_cache:
            S, W, nb = self.cfg.stride, self.cfg.window, self.cfg.branches
            n = T // S
            j = torch.arange(n, device=device)[:, None]
            i = torch.arange(W, device=device)[None, :]
            tok = (j + 1) * S - W + i                       # [n, W]
            view = (W - 1 - i) // S                          # [1, W]
            valid = tok >= 0
            flat = tok.clamp(min=0) * nb + view
            self._index_cache[key] = (flat, valid)
        return self._index_cache[key]

    def gather_slots(self, x, T):
        """x [B, T, Hkv, nb, dh] → the rows every (entry, slot) reads, [B, n, W, Hkv, dh].

        Slot i of entry j reads branch b(i) of token (j+1)S − W + i. When W = m·S the slots of
        branch b are exactly block j − b, so the result is m shifted block views (no gather);
        otherwise an explicit index gather does the same (both are checked against each other
        in lab/tests/test_model.py)."""
        cfg = self.cfg
        B = x.shape[0]
        S, W, nb = cfg.stride, cfg.window, cfg.branches
        n = T // S
        if W % S == 0 and not getattr(self, "force_gather", False):
            blocks = x[:, :n * S].reshape(B, n, S, *x.shape[2:])      # [B, n, S, Hkv, nb, dh]
            parts = []
            for b in reversed(range(nb)):                              # oldest block first
                xb = blocks[..., b, :]                                 # [B, n, S, Hkv, dh]
                if b > 0:
                    xb = torch.cat((xb.new_zeros(B, b, *xb.shape[2:]), xb[:, :n - b]), dim=1)
                parts.append(xb)
            return torch.cat(parts, dim=2)
        flat, _ = self.slot_index(T, x.device)
        xf = x.transpose(2, 3).reshape(B, T * nb, *x.shape[2:3], x.shape[-1])
        return xf[:, flat]

    def pool(self, n_in, proj, gate, bias, T):
        """Entries [B, n, Hkv, dh] of one stream; also the slot weights [B, n, W, Hkv, dh]."""
        cfg = self.cfg
        B = n_in.shape[0]
        hkv, nb, dh = cfg.kv_heads, cfg.branches, cfg.head_dim
        _, valid = self.slot_index(T, n_in.device)
        xs = self.gather_slots(proj(n_in).view(B, T, hkv, nb, dh), T)   # [B, n, W, Hkv, dh]
        if gate is not None:
            s = self.gather_slots(gate(n_in).view(B, T, hkv, nb, dh), T) + bias.transpose(0, 1)[None, None]
            s = s.masked_fill(~valid[None, :, :, None, None], float("-inf"))
            alpha = torch.softmax(s, dim=2)
        else:
            w = valid.float() / valid.float().sum(1, keepdim=True)
            alpha = w[None, :, :, None, None].expand_as(xs)
        return (alpha * xs).sum(2), alpha

    # --- the read path ------------------------------------------------------------------------
    def window_attention(self, q, kw, vw, P_idx, T):
        """Raw-window logits q·k (unscaled, invalid slots not yet masked) [B, Hkv, g, P, N] of
        query t against tokens t − N + 1 + n, n ∈ [0, N), and a function mapping the window's
        probabilities [B, Hkv, g, P, N] to its output Σ_n p_n v_{t−N+1+n} [B, Hkv, g, P, dh].

        Every position (training, and every layer but the last): queries in blocks of N, each
        block against the 2N keys [cN − N, cN + N) with one matmul, then the band i + 1 + n taken
        out of the N × 2N logits (and the probabilities scattered back into it for the values).
        A few positions (the last layer at question positions): an explicit gather."""
        N = self.cfg.win_tokens
        B, hkv, g, P, dh = q.shape
        dev = q.device
        if P < T or not torch.equal(P_idx, torch.arange(T, device=dev)):
            widx = (P_idx[:, None] - N + 1 + torch.arange(N, device=dev)[None, :]).clamp(min=0)  # [P, N]
            kg = kw[:, :, widx]                                                  # [B, Hkv, P, N, dh]
            vg = vw[:, :, widx]
            logits = (kg[:, :, None] @ q.unsqueeze(-1)).squeeze(-1)              # [B, Hkv, g, P, N]
            return logits, lambda p: (p.unsqueeze(-2) @ vg[:, :, None]).squeeze(-2)
        C = (T + N - 1) // N
        Tp = C * N
        qb = F.pad(q, (0, 0, 0, Tp - T)).view(B, hkv, g, C, N, dh)
        k2 = F.pad(kw, (0, 0, N, Tp - T)).unfold(2, 2 * N, N)                  # [B, Hkv, C, dh, 2N]
        v2 = F.pad(vw, (0, 0, N, Tp - T)).unfold(2, 2 * N, N).transpose(-1, -2)  # [B, Hkv, C, 2N, dh]
        band = (torch.arange(N, device=dev)[:, None] + 1 + torch.arange(N, device=dev)[None, :])
        band = band.expand(B, hkv, g, C, N, N)
        full = qb @ k2[:, :, None]                                               # [B, Hkv, g, C, N, 2N]
        logits = full.gather(-1, band).reshape(B, hkv, g, Tp, N)[:, :, :, :T]

        def output(p):
            pb = F.pad(p, (0, 0, 0, Tp - T)).view(B, hkv, g, C, N, N)
            dense = pb.new_zeros(B, hkv, g, C, N, 2 * N).scatter(-1, band, pb)
            return (dense @ v2[:, :, None]).reshape(B, hkv, g, Tp, dh)[:, :, :, :T]
        return logits, output

    def forward(self, n_in, query_positions=None, knock=None, head_mean=None, return_parts=False):
        """n_in [B, T, dim] (normalised input). Attention outputs at query_positions (default all),
        projected by Wo: [B, P, dim]. knock: a query head whose output is replaced by head_mean."""
        cfg = self.cfg
        B, T, _ = n_in.shape
        S, hq, hkv, dh = cfg.stride, cfg.q_heads, cfg.kv_heads, cfg.head_dim
        g = hq // hkv
        dev = n_in.device
        P_idx = torch.arange(T, device=dev) if query_positions is None else query_positions
        P = P_idx.shape[0]
        q = self.wq(n_in[:, P_idx]).view(B, P, hq, dh).transpose(1, 2)   # [B, Hq, P, dh]
        if cfg.rope:
            cq, sq = rope_tables(P_idx.cpu(), dh, cfg.rope_base)
            q = apply_rope(q, cq.to(dev), sq.to(dev))
        qg = q.reshape(B, hkv, g * P, dh)                     # query heads of one KV head together

        keys, alpha_k = self.pool(n_in, self.ck, getattr(self, "zk", None), getattr(self, "bias_k", None), T)
        vals, alpha_v = self.pool(n_in, self.cv, getattr(self, "zv", None), getattr(self, "bias_v", None), T)
        n_e = keys.shape[1]
        keys = keys.transpose(1, 2)                           # [B, Hkv, n, dh]
        vals = vals.transpose(1, 2)
        if cfg.rope:
            ce, se = rope_tables(torch.arange(n_e) * S, dh, cfg.rope_base)
            keys = apply_rope(keys, ce.to(dev), se.to(dev))
        scale = 1.0 / math.sqrt(dh)
        logits_e = (qg @ keys.transpose(-1, -2)).view(B, hkv, g, P, n_e) * scale
        visible = torch.arange(n_e, device=dev)[None, :] < ((P_idx[:, None] + 1) // S)   # [P, n]
        logits_e = logits_e.masked_fill(~visible, float("-inf"))
        parts = [logits_e]

        if cfg.win_tokens > 0:
            N = cfg.win_tokens
            kw = self.wk(n_in).view(B, T, hkv, dh).transpose(1, 2)          # [B, Hkv, T, dh]
            vw = self.wv(n_in).view(B, T, hkv, dh).transpose(1, 2)
            if cfg.rope:
                ck_, sk_ = rope_tables(torch.arange(T), dh, cfg.rope_base)
                kw = apply_rope(kw, ck_.to(dev), sk_.to(dev))
            logits_w, window_out = self.window_attention(q.view(B, hkv, g, P, dh), kw, vw, P_idx, T)
            logits_w = logits_w * scale
            wvalid = (P_idx[:, None] - N + 1 + torch.arange(N, device=dev)[None, :]) >= 0
            logits_w = logits_w.masked_fill(~wvalid, float("-inf"))
            parts.append(logits_w)

        p = torch.softmax(torch.cat(parts, dim=-1), dim=-1)  # [B, Hkv, g, P, n + N]
        out = (p[..., :n_e].reshape(B, hkv, g * P, n_e) @ vals).view(B, hkv, g, P, dh)
        if cfg.win_tokens > 0:
            out = out + window_out(p[..., n_e:])
        out = out.reshape(B, hq, P, dh)
        if knock is not None:
            out = out.clone()
            out[:, knock] = head_mean.to(out)
        heads = out
        y = self.wo(out.transpose(1, 2).reshape(B, P, hq * dh))
        if return_parts:
            return y, {"alpha_k": alpha_k, "alpha_v": alpha_v, "heads": heads}
        return y


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.attn_norm = nn.Parameter(torch.ones(cfg.dim))
        self.attn = Attention(cfg)
        self.ffn_norm = nn.Parameter(torch.ones(cfg.dim))
        self.w_gate = nn.Linear(cfg.dim, cfg.ffn, bias=False)
        self.w_up = nn.Linear(cfg.dim, cfg.ffn, bias=False)
        self.w_down = nn.Linear(cfg.ffn, cfg.dim, bias=False)
        self.eps = cfg.norm_eps

    def ffn(self, x):
        n = rms_norm(x, self.ffn_norm, self.eps)
        return self.w_down(F.silu(self.w_gate(n)) * self.w_up(n))


class LabModel(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        cfg.validate()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab, cfg.dim)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.final_norm = nn.Parameter(torch.ones(cfg.dim))
        self.reset_parameters()

    def reset_parameters(self):
        std = 0.02
        for name, p in self.named_parameters():
            if p.dim() == 2:
                nn.init.normal_(p, 0.0, std)
        for b in self.blocks:
            nn.init.normal_(b.attn.wo.weight, 0.0, std / math.sqrt(2 * self.cfg.layers))
            nn.init.normal_(b.w_down.weight, 0.0, std / math.sqrt(2 * self.cfg.layers))

    def forward(self, tokens, positions=None, knock=None, head_means=None):
        """Logits [B, P, vocab] at `positions` (default all; the last layer reads only there).
        knock = (layer, head) replaces that head's attention output by head_means[layer][head]."""
        x = self.embed(tokens)
        L = len(self.blocks)
        for l, b in enumerate(self.blocks):
            last = l == L - 1 and positions is not None
            kn = knock[1] if knock is not None and knock[0] == l else None
            hm = head_means[l][kn] if kn is not None else None
            a = b.attn(rms_norm(x, b.attn_norm, b.eps), query_positions=positions if last else None,
                       knock=kn, head_mean=hm)
            if last:
                x = x[:, positions] + a
            else:
                x = x + a
            x = x + b.ffn(x)
        x = rms_norm(x, self.final_norm, self.cfg.norm_eps)
        return x @ self.embed.weight.t()
