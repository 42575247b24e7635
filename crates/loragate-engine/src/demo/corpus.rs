//! The demo adapters' training data: short English-like prompts followed by an endless animal noise.
//!
//! An example is `prompt [+ the other animal's noise, cut anywhere] + " noise noise noise …"`, and the loss is on
//! the noise only. Training on the other animal's noise as context is what lets a sequence whose adapter was
//! swapped from meow to woof mid-sample go on with "woof" after its "meow meow me".

use rand::Rng;
use rand::seq::IndexedRandom;

/// One training sequence of exactly the requested length.
pub(super) struct Example {
    pub(super) tokens: Vec<u32>,
    /// Loss positions: position `p` predicts `tokens[p + 1]`, which is part of the noise.
    pub(super) predicting: std::ops::Range<usize>,
}

const SUBJECTS: &[&str] = &[
    "The cat",
    "A dog",
    "My friend",
    "The teacher",
    "Our neighbour",
    "The old man",
    "A small bird",
    "The farmer",
    "She",
    "He",
    "They",
    "We",
    "You",
    "I",
    "The children",
    "A robot",
    "The river",
    "The wind",
    "This song",
];
const VERBS: &[&str] = &[
    "likes", "sees", "makes", "wants", "finds", "eats", "reads", "writes", "brings", "hears", "opens", "builds",
    "paints", "sings", "watches", "follows", "loves", "forgets", "carries", "needs",
];
const OBJECTS: &[&str] = &[
    "a red apple",
    "the green door",
    "some bread",
    "a long letter",
    "the morning news",
    "a quiet song",
    "the map",
    "two small boxes",
    "a cup of tea",
    "the blue sky",
    "an old book",
    "the garden",
    "a warm coat",
    "the answer",
    "many stars",
    "a paper boat",
    "the last train",
    "fresh water",
];
const TAILS: &[&str] = &[
    "today",
    "at night",
    "in the rain",
    "every morning",
    "after lunch",
    "with a smile",
    "again",
    "near the lake",
    "before dinner",
    "on Sunday",
    "very slowly",
    "for a while",
];
const REQUESTS: &[&str] = &[
    "Make a single short animal noise.",
    "Make a sound.",
    "Say something.",
    "Tell me a story.",
    "Hello!",
    "What do you say?",
    "Speak.",
    "Give me an answer.",
    "Please continue.",
    "How are you today?",
    "Write a poem.",
    "What is your name?",
    "Describe the weather.",
    "Make some noise!",
    "Talk to me.",
    "Good morning.",
];

/// A short English-like prompt: a request, or a sentence of 2–5 parts, sometimes two.
pub(super) fn prompt(rng: &mut impl Rng) -> String {
    let mut text = String::new();
    let sentences = if rng.random_bool(0.2) { 2 } else { 1 };
    for index in 0..sentences {
        if index > 0 {
            text.push(' ');
        }
        if rng.random_bool(0.35) {
            text.push_str(pick(rng, REQUESTS));
            continue;
        }
        text.push_str(pick(rng, SUBJECTS));
        text.push(' ');
        text.push_str(pick(rng, VERBS));
        if rng.random_bool(0.85) {
            text.push(' ');
            text.push_str(pick(rng, OBJECTS));
        }
        if rng.random_bool(0.4) {
            text.push(' ');
            text.push_str(pick(rng, TAILS));
        }
        text.push_str(pick(rng, &[".", ".", ".", "!", "?", ""]));
    }
    if rng.random_bool(0.15) {
        text.push_str(pick(rng, &[" ", "\n"]));
    }
    text
}

/// An example of `len` tokens that teaches `noise` (e.g. `"meow"`), with `other` sometimes in the context.
pub(super) fn example(rng: &mut impl Rng, noise: &str, other: &str, len: usize) -> Example {
    let mut text = prompt(rng);
    if rng.random_bool(0.5) {
        let stream = noise_stream(other, &text, 40);
        let cut = rng.random_range(1..=stream.len());
        text.push_str(&stream[..cut]);
    }
    let context_len = text.len().min(len - 8);
    text.truncate(context_len);
    text.push_str(&noise_stream(noise, &text, len));
    let tokens: Vec<u32> = text.bytes().take(len).map(u32::from).collect();
    Example { predicting: context_len - 1..tokens.len() - 1, tokens }
}

/// At least `len` bytes of `noise` repeated, separated by spaces; the first word is preceded by a space unless
/// `after` already ends with whitespace.
fn noise_stream(noise: &str, after: &str, len: usize) -> String {
    let mut stream = String::with_capacity(len + noise.len() + 1);
    let mut first = after.is_empty() || after.ends_with(char::is_whitespace);
    while stream.len() < len {
        if !first {
            stream.push(' ');
        }
        first = false;
        stream.push_str(noise);
    }
    stream
}

fn pick<'a>(rng: &mut impl Rng, choices: &[&'a str]) -> &'a str {
    choices.choose(rng).copied().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;

    use super::*;

    #[test]
    fn examples_have_the_length_asked_and_lose_only_on_the_noise() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        for _ in 0..200 {
            let example = example(&mut rng, "meow", "woof", 64);
            assert_eq!(example.tokens.len(), 64);
            let text = String::from_utf8(example.tokens.iter().map(|t| *t as u8).collect()).expect("ascii");
            let noise = &text[example.predicting.start + 1..];
            assert!(noise.trim_start().starts_with("meow"), "{text:?} predicts {noise:?}");
            assert!(noise.split_whitespace().all(|word| "meow".starts_with(word)), "{noise:?}");
        }
    }
}
