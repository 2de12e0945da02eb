"""
BERT's WordPiece tokenizer (the tokenizers library), as a model folder or our checkpoint holds it:
its tokenizer.json, its vocab.txt (uncased), or our checkpoint's metadata. Each is checked: it adds
[CLS] ... [SEP], its ids fit the model's vocabulary, and it truncates at the model's length.
"""
from pathlib import Path

from checkpoint import LoadError


def of(ck, max_len=128, config=None):
    """The tokenizer of what checkpoint.load read: our checkpoint's metadata, a folder's
    tokenizer.json or vocab.txt (uncased); checked against, and capped by, the model's config
    (config(): its BertConfig, when ck has one)."""
    from tokenizers import Tokenizer
    src = ck.path
    if src == ck.weights:  # our checkpoint
        if ck.tokenizer is None:
            raise LoadError(f"{src}: no 'tokenizer' in the safetensors metadata; pass the base "
                            "model's folder instead")
        what, make = f"{src} (metadata 'tokenizer')", lambda: Tokenizer.from_str(ck.tokenizer)
    elif ck.tokenizer is None:
        raise LoadError(f"{src}: no tokenizer.json or vocab.txt; put one of them in the model "
                        "folder")
    elif ck.tokenizer.name == "tokenizer.json":
        what, make = ck.tokenizer, lambda: Tokenizer.from_file(str(ck.tokenizer))
    else:
        what, make = ck.tokenizer, lambda: from_vocab(ck.tokenizer)
    try:
        tok = make()
        tok.no_padding()
        tok.no_truncation()
        ids = tok.encode("a").ids
    except LoadError:
        raise
    except Exception as e:  # the tokenizers library raises plain Exceptions with a parser message
        reason = (str(e).splitlines() or [type(e).__name__])[0]
        raise LoadError(f"{what}: not a valid tokenizer ({reason}); re-create it") from None
    cls_id, sep_id = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    if cls_id is None or sep_id is None or ids[:1] != [cls_id] or ids[-1:] != [sep_id]:
        raise LoadError(f"{what}: the tokenizer does not add [CLS] ... [SEP] (it gives {ids} for "
                        "'a'); SG-BERT's sentence vector is the [CLS] token")
    if ck.config is not None and config is not None:
        config = config()
        check_vocab(tok, config, what)
        max_len = min(max_len, config.max_position_embeddings)  # no position embedding beyond
    tok.enable_truncation(max_length=max_len)
    return tok


def check_vocab(tokenizer, config, source="tokenizer"):
    """Every id the tokenizer can give must be a row of the model's embedding table."""
    top = max(tokenizer.get_vocab(with_added_tokens=True).values(), default=-1)
    if top >= config.vocab_size:
        raise LoadError(f"{source}: the tokenizer gives ids up to {top} but the model's "
                        f"vocab_size is {config.vocab_size}; it belongs to another model")


def from_vocab(vocab_file):
    """The uncased BERT WordPiece tokenizer (google-bert's BasicTokenizer + WordpieceTokenizer)."""
    from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers, processors
    from tokenizers.models import WordPiece
    try:
        words = Path(vocab_file).read_text(encoding="utf-8").split("\n")
    except UnicodeDecodeError as e:
        raise LoadError(f"{vocab_file}: not UTF-8 text ({e.reason} at byte {e.start}); save it as "
                        "UTF-8") from None
    vocab = {w: i for i, w in enumerate(words) if w}
    for t in ("[CLS]", "[SEP]", "[UNK]", "[PAD]"):
        if t not in vocab:
            raise LoadError(f"{vocab_file}: the special token {t} is not in the vocabulary")
    tok = Tokenizer(WordPiece(vocab, unk_token="[UNK]", max_input_chars_per_word=100))
    tok.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True,
                                                lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.BertProcessing(("[SEP]", vocab["[SEP]"]),
                                                   ("[CLS]", vocab["[CLS]"]))
    tok.decoder = decoders.WordPiece()
    return tok
