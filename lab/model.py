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
  gated    chunked compression, stride S, window W ≥ S: a key stream and a value stream, each
           with its own per-branch projections (payload x_b = C_b·n, gate logits z_b = Z_b·n,
           b = branch, DeepSeek-V4's layout) and a per-slot bias. With lead λ = (S − origin) mod S
           (phasekv's staggered origin, docs/DESIGN.md §2), entry j pools the tokens
           [(j+1)S − W − λ, (j+1)S − λ) (slots whose token is negative are padding, excluded):
             slot i reads branch b(i) = floor((W − 1 − i) / S) of its token,
             α_{j,i} = softmax_i(z_{b(i)}(t_i) + bias_i)   per channel (vector gates),
             K̂_j = Σ_i α_{j,i} ⊙ x_{b(i)}(t_i);
           keys are then rotated by RoPE at the anchor j·S − λ (block start), values are not.
           A query at t attends to entries j < floor((t + 1 + λ) / S) and to the raw window
           tokens [t − N_win + 1, t] (keys W_k·n RoPE'd at their own positions, values W_v·n) in
           one softmax with logits q·k / sqrt(d).
  mean     the same with uniform weights over the real slots (no gate projections, no bias).
  norope   gated, with no RoPE anywhere (queries, window keys and entries; a NoPE model).

Origins: every (layer l, KV head h) has its own compressor with origin
  (origin + l · layer_stagger + h · head_stagger + o_b) mod S,
o_b an offset per sequence (0 unless training draws a random origin, `forward(origin_offsets=)`).

Token shift (`token_shift`): the compressors also read the previous token — payload
x_b(t) = C_b·n_t + C'_b·n_{t−1}, logits likewise (n_{−1} = 0) — so a pooled entry can bind a
token to its predecessor (a key to its value) whatever the block boundary between them.

phasekv equivalents (lab/host/lab_model.hpp): keys compressor_policy<vector_gated_pool,
rope_after_pool>, values compressor_policy<vector_gated_pool>, per_branch inputs laid out
[token][branches][head_dim] per KV head, slot_bias [W][head_dim], geometry {S, W, origin,
anchor block_start}; one paged_cache per (layer, KV head) with raw window N_win; sparse_reader
with top_k = 0 (every complete entry), separate key and value streams.
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
    kv_heads: int = 2
    head_dim: int = 16
    ffn: int = 192
    stride: int = 8
    window: int = 8
    win_tokens: int = 16       # N_win, the raw local window (0 for full attention)
    rope_base: float = 10000.0
    norm_eps: float = 1e-6
    origin: int = 0
    layer_stagger: int = 0
    head_stagger: int = 0
    token_shift: bool = False

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
        for name in ("origin", "layer_stagger", "head_stagger"):
            if getattr(self, name) < 0:
                raise ValueError(f"model.{name} must be at least 0, got {getattr(self, name)}")

    @property
    def branches(self):
        return (self.window + self.stride - 1) // self.stride

    @property
    def gated(self):
        return self.kind in ("gated", "norope")

    @property
    def rope(self):
        return self.kind != "norope"

    def origin_of(self, layer, head):
        return (self.origin + layer * self.layer_stagger + head * self.head_stagger) % self.stride

    def to_dict(self):
        return asdict(self)


def rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope_tables(positions, dim, base):
    """cos, sin of p·θ_k for positions of any shape: [..., dim/2], formed in double."""
    k = torch.arange(dim // 2, dtype=torch.float64)
    inv = base ** (-2.0 * k / dim)
    ang = positions.to(torch.float64)[..., None] * inv
    return torch.cos(ang).float(), torch.sin(ang).float()


def apply_rope(x, cos, sin):
    """Half-split RoPE on the last dim of x with cos/sin broadcasting against x[..., :d/2]."""
    h = x.shape[-1] // 2
    a, b = x[..., :h], x[..., h:]
    return torch.cat((a * cos - b * sin, a * sin + b * cos), dim=-1)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int = 0):
        super().__init__()
        self.cfg = cfg
        self.layer = layer
        d, hq, hkv, dh = cfg.dim, cfg.q_heads, cfg.kv_heads, cfg.head_dim
        self.wq = nn.Linear(d, hq * dh, bias=False)
        self.wo = nn.Linear(hq * dh, d, bias=False)
        if cfg.kind != "full":
            self.wk = nn.Linear(d, hkv * dh, bias=False)   # raw window keys
            self.wv = nn.Linear(d, hkv * dh, bias=False)   # raw window values
        nb = cfg.branches
        # Compressor projections, output features ordered [kv_head][branch][channel]; with the
        # token shift a second set reads the previous token.
        names = ["ck", "cv"] + (["zk", "zv"] if cfg.gated else [])
        for name in names:
            setattr(self, name, nn.Linear(d, hkv * nb * dh, bias=False))
            if cfg.token_shift:
                setattr(self, name + "_prev", nn.Linear(d, hkv * nb * dh, bias=False))
        if cfg.gated:
            self.bias_k = nn.Parameter(torch.zeros(hkv, cfg.window, dh))
            self.bias_v = nn.Parameter(torch.zeros(hkv, cfg.window, dh))

    def leads(self, B, offsets, device):
        """λ per (sequence, KV head): [B, Hkv]."""
        cfg = self.cfg
        S = cfg.stride
        base = torch.tensor([cfg.origin_of(self.layer, h) for h in range(cfg.kv_heads)], device=device)
        off = torch.zeros(B, dtype=torch.long, device=device) if offsets is None else offsets.to(device)
        origin = (base[None, :] + off[:, None]) % S
        return (S - origin) % S

    def project(self, name, n_in, n_prev):
        y = getattr(self, name)(n_in)
        if self.cfg.token_shift:
            y = y + getattr(self, name + "_prev")(n_prev)
        return y

    # --- the write path -----------------------------------------------------------------------
    def pool(self, n_in, n_prev, payload, gate, bias, lead):
        """Entries [B, Hkv, n, dh] of one stream (n = ceil(T/S), the most any lead completes) and
        the slot weights [B, Hkv, n, W, dh]; entries a sequence's lead does not complete are
        finite and never visible."""
        cfg = self.cfg
        B, T, _ = n_in.shape
        S, W, nb, hkv, dh = cfg.stride, cfg.window, cfg.branches, cfg.kv_heads, cfg.head_dim
        dev = n_in.device
        n = (T + S - 1) // S
        j = torch.arange(n, device=dev)
        i = torch.arange(W, device=dev)
        tok = (j[:, None] + 1) * S - W + i[None, :] - lead[:, :, None, None]      # [B, Hkv, n, W]
        valid = (tok >= 0) & (tok < T)
        tok = tok.clamp(0, T - 1)
        view = (W - 1 - i) // S                                                  # [W]
        b_idx = torch.arange(B, device=dev)[:, None, None, None]
        h_idx = torch.arange(hkv, device=dev)[None, :, None, None]
        x = self.project(payload, n_in, n_prev).view(B, T, hkv, nb, dh)
        xs = x[b_idx, tok, h_idx, view]                                          # [B, Hkv, n, W, dh]
        if gate is not None:
            s = self.project(gate, n_in, n_prev).view(B, T, hkv, nb, dh)[b_idx, tok, h_idx, view]
            s = s + bias[None, :, None]
            # −1e30, not −inf: an entry with no real slot stays finite (it is never visible).
            s = s.masked_fill(~valid[..., None], -1e30)
            alpha = torch.softmax(s, dim=3)
        else:
            w = valid.float() / valid.float().sum(-1, keepdim=True).clamp(min=1.0)
            alpha = w[..., None].expand_as(xs)
        return (alpha * xs).sum(3), alpha

    # --- the read path ------------------------------------------------------------------------
    def forward(self, n_in, query_positions=None, origin_offsets=None, knock=None, head_mean=None,
                return_parts=False):
        """n_in [B, T, dim] (normalised input). Attention outputs at query_positions (default all;
        else [B, P] per sequence), projected by Wo: [B, P, dim]. knock: a list of query heads whose
        outputs are replaced by head_mean [Hq, dh] (a mean ablation)."""
        cfg = self.cfg
        B, T, _ = n_in.shape
        S, hq, hkv, dh, N = cfg.stride, cfg.q_heads, cfg.kv_heads, cfg.head_dim, cfg.win_tokens
        g = hq // hkv
        dev = n_in.device
        if query_positions is None:
            pos = torch.arange(T, device=dev)[None, :].expand(B, T)
        else:
            pos = query_positions.to(dev)
        P = pos.shape[1]
        rows = n_in.gather(1, pos[..., None].expand(B, P, n_in.shape[-1]))
        q = self.wq(rows).view(B, P, hq, dh).transpose(1, 2)                    # [B, Hq, P, dh]
        if cfg.rope:
            cq, sq = rope_tables(pos, dh, cfg.rope_base)                         # [B, P, dh/2]
            q = apply_rope(q, cq[:, None].to(dev), sq[:, None].to(dev))
        q = q.view(B, hkv, g, P, dh)

        n_prev = F.pad(n_in, (0, 0, 1, 0))[:, :T] if cfg.token_shift else None
        lead = self.leads(B, origin_offsets, dev)                                # [B, Hkv]
        keys, alpha_k = self.pool(n_in, n_prev, "ck", "zk" if cfg.gated else None, getattr(self, "bias_k", None), lead)
        vals, alpha_v = self.pool(n_in, n_prev, "cv", "zv" if cfg.gated else None, getattr(self, "bias_v", None), lead)
        n_e = keys.shape[2]
        j = torch.arange(n_e, device=dev)
        if cfg.rope:
            ce, se = rope_tables(j[None, None, :] * S - lead[..., None], dh, cfg.rope_base)   # [B, Hkv, n, dh/2]
            keys = apply_rope(keys, ce.to(dev), se.to(dev))
        scale = 1.0 / math.sqrt(dh)
        logits_e = torch.einsum("bhgpd,bhnd->bhgpn", q, keys) * scale
        visible = j[None, None, None, :] < torch.div(pos[:, None, :, None] + 1 + lead[:, :, None, None], S,
                                                     rounding_mode="floor")        # [B, Hkv, P, n]
        logits_e = logits_e.masked_fill(~visible[:, :, None], float("-inf"))
        parts = [logits_e]

        if N > 0:
            kw = self.wk(n_in).view(B, T, hkv, dh)
            vw = self.wv(n_in).view(B, T, hkv, dh)
            if cfg.rope:
                ck_, sk_ = rope_tables(torch.arange(T, device=dev), dh, cfg.rope_base)
                kw = apply_rope(kw, ck_[:, None].to(dev), sk_[:, None].to(dev))
            widx = pos[..., None] - N + 1 + torch.arange(N, device=dev)           # [B, P, N]
            wvalid = widx >= 0
            b_idx = torch.arange(B, device=dev)[:, None, None]
            kg = kw[b_idx, widx.clamp(min=0)]                                       # [B, P, N, Hkv, dh]
            vg = vw[b_idx, widx.clamp(min=0)]
            logits_w = torch.einsum("bhgpd,bpnhd->bhgpn", q, kg) * scale
            logits_w = logits_w.masked_fill(~wvalid[:, None, None], float("-inf"))
            parts.append(logits_w)

        p = torch.softmax(torch.cat(parts, dim=-1), dim=-1)                       # [B, Hkv, g, P, n + N]
        out = torch.einsum("bhgpn,bhnd->bhgpd", p[..., :n_e], vals)
        if N > 0:
            out = out + torch.einsum("bhgpn,bpnhd->bhgpd", p[..., n_e:], vg)
        out = out.reshape(B, hq, P, dh)
        if knock:
            out = out.clone()
            for h in knock:
                out[:, h] = head_mean[h].to(out)
        y = self.wo(out.transpose(1, 2).reshape(B, P, hq * dh))
        if return_parts:
            return y, {"alpha_k": alpha_k, "alpha_v": alpha_v, "heads": out, "lead": lead}
        return y


class Block(nn.Module):
    def __init__(self, cfg, layer):
        super().__init__()
        self.attn_norm = nn.Parameter(torch.ones(cfg.dim))
        self.attn = Attention(cfg, layer)
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
        self.blocks = nn.ModuleList(Block(cfg, l) for l in range(cfg.layers))
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

    def forward(self, tokens, positions=None, origin_offsets=None, knock=None, head_means=None, parts=None):
        """Logits [B, P, vocab] at `positions` ([B, P] per sequence, or [P] shared; default all;
        the last layer reads only there). knock = (layer, [query heads]) replaces those heads'
        attention outputs by head_means[layer][head]. parts: a list that receives every layer's
        return_parts dictionary."""
        x = self.embed(tokens)
        B = tokens.shape[0]
        if positions is not None and positions.dim() == 1:
            positions = positions[None, :].expand(B, -1)
        L = len(self.blocks)
        for l, b in enumerate(self.blocks):
            last = l == L - 1 and positions is not None
            kn = knock[1] if knock is not None and knock[0] == l else None
            hm = head_means[l] if kn else None
            r = b.attn(rms_norm(x, b.attn_norm, b.eps), query_positions=positions if last else None,
                       origin_offsets=origin_offsets, knock=kn, head_mean=hm, return_parts=parts is not None)
            if parts is not None:
                a, info = r
                parts.append(info)
            else:
                a = r
            if last:
                x = x.gather(1, positions[..., None].expand(B, positions.shape[1], x.shape[-1])) + a
            else:
                x = x + a
            x = x + b.ffn(x)
        x = rms_norm(x, self.final_norm, self.cfg.norm_eps)
        return x @ self.embed.weight.t()
