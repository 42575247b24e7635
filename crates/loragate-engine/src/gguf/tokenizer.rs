//! The tokenizer of a GGUF file (`tokenizer.ggml.*`), rebuilt as the `tokenizers::Tokenizer` its Hugging Face
//! `tokenizer.json` would have been: the `gpt2` byte-level BPE with its vocabulary and merges, the pre-tokenizer
//! named by `tokenizer.ggml.pre` (llama.cpp's names for the splitting rules of each model family), the byte-level
//! decoder, control tokens as special tokens (matched in text, skipped when decoding), and a BOS prepended when
//! `tokenizer.ggml.add_bos_token` says so.

use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{BPE, Vocab};
use tokenizers::normalizers::unicode::NFC;
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::tokenizer::SplitDelimiterBehavior;
use tokenizers::{AddedToken, Tokenizer};

use super::Metadata;
use crate::error::EngineLoadError;

/// llama.cpp's token types (`tokenizer.ggml.token_type`).
const CONTROL: u64 = 3;
const USER_DEFINED: u64 = 4;

/// LLaMA 3's splitting rule (digits in groups of up to three).
const LLAMA3_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen2's splitting rule (single digits).
const QWEN2_REGEX: &str =
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// How text is split before BPE, by llama.cpp's pre-tokenizer name.
enum PreTokenizer {
    /// GPT-2's rule (the byte-level pre-tokenizer's own regex).
    Gpt2,
    /// Each digit alone, then GPT-2's rule (StarCoder, SmolLM, …).
    DigitsThenGpt2,
    /// A model-specific regex, then the byte-level mapping; Qwen2 also NFC-normalizes.
    Regex { regex: &'static str, nfc: bool },
}

impl PreTokenizer {
    fn named(name: &str) -> Option<Self> {
        Some(match name {
            "default" | "gpt2" | "gpt-2" | "olmo" | "mpt" => Self::Gpt2,
            "smollm" | "starcoder" | "refact" | "codeshell" | "command-r" | "exaone" => Self::DigitsThenGpt2,
            "llama3" | "llama-v3" | "llama-bpe" | "smaug-bpe" => Self::Regex { regex: LLAMA3_REGEX, nfc: false },
            "qwen2" | "deepseek-r1-qwen" => Self::Regex { regex: QWEN2_REGEX, nfc: true },
            _ => return None,
        })
    }
}

/// Builds the tokenizer. Anything it cannot reproduce exactly (another tokenizer model, an unknown pre-tokenizer) is
/// refused with its name rather than tokenized differently from the model's training.
pub(super) fn tokenizer(metadata: &Metadata<'_>) -> Result<Tokenizer, EngineLoadError> {
    let model = metadata.string("tokenizer.ggml.model", metadata.required("tokenizer.ggml.model")?)?;
    if model != "gpt2" {
        return Err(EngineLoadError::Tokenizer(format!(
            "tokenizer.ggml.model {model:?} is not supported (only \"gpt2\", the byte-level BPE of LLaMA 3, Qwen2, \
             SmolLM and others)"
        )));
    }
    let pre_name = metadata.optional_string("tokenizer.ggml.pre")?.unwrap_or("default");
    let pre = PreTokenizer::named(pre_name).ok_or_else(|| {
        EngineLoadError::Tokenizer(format!("tokenizer.ggml.pre {pre_name:?} is not a pre-tokenizer this engine knows"))
    })?;
    let tokens = metadata.strings("tokenizer.ggml.tokens")?;
    let vocab: Vocab = tokens.iter().enumerate().map(|(id, token)| ((*token).to_owned(), id as u32)).collect();
    if vocab.len() != tokens.len() {
        return Err(EngineLoadError::Tokenizer("tokenizer.ggml.tokens lists a token twice".into()));
    }
    let merges = metadata
        .strings("tokenizer.ggml.merges")?
        .into_iter()
        .map(|merge| {
            merge.split_once(' ').map(|(left, right)| (left.to_owned(), right.to_owned())).ok_or_else(|| {
                EngineLoadError::Tokenizer(format!("tokenizer.ggml.merges: {merge:?} is not two tokens"))
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .build()
        .map_err(|err| EngineLoadError::Tokenizer(format!("tokenizer.ggml.merges: {err}")))?;
    let mut tokenizer = Tokenizer::new(bpe);
    match pre {
        PreTokenizer::Gpt2 => {
            tokenizer.with_pre_tokenizer(Some(ByteLevel::new(false, true, true)));
        }
        PreTokenizer::DigitsThenGpt2 => {
            let steps: Vec<PreTokenizerWrapper> =
                vec![Digits::new(true).into(), ByteLevel::new(false, true, true).into()];
            tokenizer.with_pre_tokenizer(Some(Sequence::new(steps)));
        }
        PreTokenizer::Regex { regex, nfc } => {
            let split = Split::new(SplitPattern::Regex(regex.to_owned()), SplitDelimiterBehavior::Isolated, false)
                .map_err(|err| EngineLoadError::Tokenizer(format!("pre-tokenizer {pre_name:?}: {err}")))?;
            let steps: Vec<PreTokenizerWrapper> = vec![split.into(), ByteLevel::new(false, true, false).into()];
            tokenizer.with_pre_tokenizer(Some(Sequence::new(steps)));
            if nfc {
                tokenizer
                    .with_normalizer(Some(NFC))
                    .map_err(|err| EngineLoadError::Tokenizer(format!("pre-tokenizer {pre_name:?}: {err}")))?;
            }
        }
    }
    tokenizer.with_decoder(Some(ByteLevelDecoder::default()));
    add_special_tokens(&mut tokenizer, metadata, &tokens)?;
    if metadata.optional_bool("tokenizer.ggml.add_bos_token")?.unwrap_or(false) {
        let bos = metadata.required_u64("tokenizer.ggml.bos_token_id")?;
        let text = tokens.get(bos as usize).ok_or_else(|| {
            EngineLoadError::Tokenizer(format!("tokenizer.ggml.bos_token_id ({bos}) is outside the vocabulary"))
        })?;
        let template = TemplateProcessing::builder()
            .try_single(format!("{text} $0"))
            .and_then(|builder| builder.try_pair(format!("{text} $A {text} $B")))
            .map_err(|err| EngineLoadError::Tokenizer(format!("BOS template: {err}")))?
            .special_tokens(vec![((*text).to_owned(), bos as u32)])
            .build()
            .map_err(|err| EngineLoadError::Tokenizer(format!("BOS template: {err}")))?;
        tokenizer.with_post_processor(Some(template));
    }
    Ok(tokenizer)
}

/// Control tokens (and the BOS/EOS/padding/unknown tokens) become special tokens: matched whole in text such as a
/// rendered chat template, skipped when decoding. User-defined tokens are matched whole but decoded as text.
fn add_special_tokens(
    tokenizer: &mut Tokenizer,
    metadata: &Metadata<'_>,
    tokens: &[&str],
) -> Result<(), EngineLoadError> {
    let mut special = vec![false; tokens.len()];
    let mut user_defined = vec![false; tokens.len()];
    if let Some(types) = metadata.get("tokenizer.ggml.token_type") {
        let types = metadata.array("tokenizer.ggml.token_type", types)?;
        if types.len() != tokens.len() {
            return Err(EngineLoadError::Tokenizer(format!(
                "tokenizer.ggml.token_type has {} entries for {} tokens",
                types.len(),
                tokens.len()
            )));
        }
        for (id, kind) in types.iter().enumerate() {
            match metadata.u64("tokenizer.ggml.token_type", kind)? {
                CONTROL => special[id] = true,
                USER_DEFINED => user_defined[id] = true,
                _ => {}
            }
        }
    }
    for key in ["bos_token_id", "eos_token_id", "eot_token_id", "eom_token_id", "padding_token_id", "unknown_token_id"]
    {
        let key = format!("tokenizer.ggml.{key}");
        if let Some(id) = metadata.optional_u64(&key)? {
            let flag = special
                .get_mut(id as usize)
                .ok_or_else(|| EngineLoadError::Tokenizer(format!("{key} ({id}) is outside the vocabulary")))?;
            *flag = true;
        }
    }
    let added = |flags: &[bool], is_special: bool| -> Vec<AddedToken> {
        flags
            .iter()
            .zip(tokens)
            .filter(|(flag, _)| **flag)
            .map(|(_, token)| AddedToken::from(*token, is_special).normalized(false))
            .collect()
    };
    let error = |err: tokenizers::Error| EngineLoadError::Tokenizer(format!("special tokens: {err}"));
    tokenizer.add_special_tokens(added(&special, true)).map_err(error)?;
    tokenizer.add_tokens(added(&user_defined, false)).map_err(error)?;
    Ok(())
}
