"""
PromptBERT's sentence vector: BERT reads the sentence inside a template such as `This sentence of "[X]" means [MASK] .`,
and the last layer's hidden state at the [MASK] token is the sentence's vector. In training, template denoising
subtracts from it the [MASK] vector of the same template read without the sentence.

References: Jiang et al., "PromptBERT: Improving BERT Sentence Embeddings with Prompts", EMNLP 2022 (Eq. 2, Sec. 4.3),
and the official code (kongds/Prompt-BERT: train.py prepare_features, prompt_bert/models.py get_delta, evaluation.py
batcher), which we follow where the paper says nothing:
- A template is data: one string with one [X] (where the sentence goes) and one [MASK]. The text before [X], the
  sentence and the text after [X] are tokenized apart and joined as [CLS] before.. sentence.. after.. [SEP], as the
  code joins its pieces, so the quote marks around [X] stay tokens of their own.
- Only the sentence is truncated (to the tokenizer's max length: 32 in training, the code's max_seq_length, which
  counts the sentence alone), never the template.
- [MASK] is found by where the template puts it (counted from the end when it follows [X]), not by looking for its id:
  a sentence holding the text "[MASK]" (a special token to most tokenizers) cannot move it.
- At evaluation a sentence that does not end in . ? " or ' gets a '.' (the code's evaluation batcher; not in training).
- Denoising: the template alone, with the tokens after [X] at the positions they have after a sentence of n tokens;
  one forward per distinct n in the batch, with gradient. The code computes n = 0..49 at every step: the same vectors.

torch is imported where it is used: the command line checks a template with split() before torch loads.

Legend: B = sentences, T = tokens of the longest input, T0 = tokens of the template alone, D = distinct lengths.
"""
from types import SimpleNamespace

import checkpoint
from lab import augment

# the unsupervised BERT recipe's two templates (run.sh unsup-bert); the first is also the one evaluated
TRAIN_TEMPLATES = ('This sentence of "[X]" means [MASK] .', 'This sentence : "[X]" means [MASK] .')
# the paper's best manual template on untrained BERT (Table 4; Table 5's 67.85 avg), run.sh bert-prompt's
UNTRAINED_TEMPLATE = TRAIN_TEMPLATES[1]
ENDINGS = ".?\"'"  # evaluation: a sentence that ends otherwise gets a '.'


def split(template):
    """'text [X] text' -> (the text before [X], the text after it); a ValueError saying what is missing or doubled
    unless there is exactly one [X] and one [MASK]."""
    wrong = [f"{'no' if n == 0 else n} {p}" for p in ("[X]", "[MASK]") if (n := template.count(p)) != 1]
    if wrong:
        raise ValueError(f"{template!r} has {' and '.join(wrong)}: a template holds exactly one [X] (where the "
                         f"sentence goes) and one [MASK] (whose vector is the sentence's), e.g. {TRAIN_TEMPLATES[0]!r}")
    before, after = template.split("[X]")
    return before, after


def end_with_period(sentence):
    """Evaluation's input: a sentence that does not end in . ? " or ' gets a '.'."""
    s = sentence.rstrip()
    return s + "." if s and s[-1] not in ENDINGS else sentence


class Template:
    """A template tokenized once for one tokenizer: prefix ([CLS] and the ids before [X]), suffix (the ids after [X]
    and [SEP]), and where [MASK] is. bert.encode takes it as its tokenizer (encode_batch: the template around each
    sentence) and `vector` as its pooling.

    tokenizer: bert.load_tokenizer's; its max length is the sentence's budget, cut further so that the whole input
    fits max_positions. end_period: evaluation's '.' (end_with_period); off in training."""

    def __init__(self, text, tokenizer, max_positions, end_period=False):
        from tokenizers import Tokenizer
        before, after = split(text)
        self.text, self.end_period = text, end_period
        self.tok = Tokenizer.from_str(tokenizer.to_str())  # a copy that never truncates: the sentence is cut below
        self.tok.no_truncation()
        special = {t: tokenizer.token_to_id(t) for t in ("[CLS]", "[SEP]", "[MASK]")}
        missing = [t for t, i in special.items() if i is None]
        if missing:
            raise checkpoint.LoadError(f"{text!r}: the tokenizer has no {missing[0]} token")
        mask = special["[MASK]"]
        self.prefix = [special["[CLS]"], *self.words(before, mask)]
        self.suffix = [*self.words(after, mask), special["[SEP]"]]
        # [MASK]'s index: from the start (>= 0) when it comes before [X], else from the end (< 0)
        self.mask_at = self.prefix.index(mask) if mask in self.prefix else self.suffix.index(mask) - len(self.suffix)
        budget = (tokenizer.truncation or {}).get("max_length") or max_positions
        self.max_len = min(budget, max_positions - len(self))  # sentence tokens
        if self.max_len < 1:
            raise checkpoint.LoadError(f"{text!r} takes {len(self)} tokens: with a sentence it does not fit the "
                                       f"model's {max_positions} positions")

    def __len__(self):
        return len(self.prefix) + len(self.suffix)

    def words(self, text, mask):
        """The ids of text, its [MASK] as the mask token and the text on each side of it tokenized apart (what a
        tokenizer that knows [MASK] as a special token does)."""
        ids = [self.tok.encode(part, add_special_tokens=False).ids for part in text.split("[MASK]")]
        return [*ids[0], *(i for part in ids[1:] for i in (mask, *part))]

    def encode_batch(self, sentences):
        """Each sentence inside the template, as bert.batch_tensors reads an encoding (.ids): the sentence's tokens
        cut to max_len, the template's never."""
        sentences = [end_with_period(s) for s in sentences] if self.end_period else list(sentences)
        return [SimpleNamespace(ids=self.prefix + e.ids[:self.max_len] + self.suffix)
                for e in self.tok.encode_batch(sentences, add_special_tokens=False)]

    def mask_positions(self, attention_mask):
        """(B,) where each input's [MASK] is, in a right-padded batch (B, T) of this template's inputs."""
        import torch
        n = attention_mask.sum(1)
        return torch.full_like(n, self.mask_at) if self.mask_at >= 0 else n + self.mask_at

    def vector(self, hidden_states, attention_mask, layer=-1):
        """The [MASK] token's hidden state in hidden_states[layer] (B, T, H) -> (B, H): PromptBERT's sentence vector,
        as a pooling function of bert.encode."""
        import torch
        x = hidden_states[layer]
        return x[torch.arange(len(x), device=x.device), self.mask_positions(attention_mask)]

    def alone(self, lengths):
        """The template without a sentence, once per sentence length n in lengths (D,): ids and position ids (D, T0),
        the tokens after [X] at the positions they have after n sentence tokens (the paper's Sec. 4.3)."""
        import torch
        T0, P = len(self), len(self.prefix)
        ids = torch.tensor([self.prefix + self.suffix], device=lengths.device).repeat(len(lengths), 1)
        j = torch.arange(T0, device=lengths.device)
        return ids, j + (j >= P) * lengths[:, None]

    def denoised(self, model, ids, attention_mask):
        """PromptBERT's training vector (B, H): each sentence's [MASK] vector less that of the template alone at the
        sentence's length. One batched forward of the template per distinct length, with gradient (the code's
        default), in the model's train or eval mode as it is."""
        import torch
        h = self.vector(model(ids, attention_mask), attention_mask)
        lengths, which = torch.unique(attention_mask.sum(1) - len(self), return_inverse=True)  # (D,), (B,)
        ids0, pos0 = self.alone(lengths)
        bias = self.vector(augment.forward(model, ids0, position_ids=pos0), torch.ones_like(ids0))  # (D, H)
        return h - bias[which]
