//! The limits on stop strings, and the one check every front's stop strings pass (the HTTP front's `stop`, the Tinker
//! front's `sampling_params.stop`): a request may give at most [`MAX_STOP_STRINGS`] stop strings of at most
//! [`MAX_STOP_STRING_BYTES`] bytes each, none empty, so watching one piece of text costs at most a few microseconds'
//! worth of comparisons over a window shorter than the longest stop string.

/// The most stop strings one request may give.
pub const MAX_STOP_STRINGS: usize = 16;
/// The longest stop string accepted, in bytes.
pub const MAX_STOP_STRING_BYTES: usize = 256;

/// Checks a request's stop strings against the limits (none may be empty either); the reason says which limit. Every
/// front that watches stop strings checks them here.
pub fn check_stop_strings(stops: &[String]) -> Result<(), String> {
    if stops.len() > MAX_STOP_STRINGS {
        return Err(format!("has {} stop strings, the limit is {MAX_STOP_STRINGS}", stops.len()));
    }
    if stops.iter().any(String::is_empty) {
        return Err("stop strings must not be empty".to_owned());
    }
    if let Some(long) = stops.iter().find(|stop| stop.len() > MAX_STOP_STRING_BYTES) {
        return Err(format!("a stop string is {} bytes long, the limit is {MAX_STOP_STRING_BYTES}", long.len()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_strings_are_capped_in_count_and_length() {
        let many: Vec<String> = (0..=MAX_STOP_STRINGS).map(|i| i.to_string()).collect();
        assert!(check_stop_strings(&many).expect_err("too many").contains("limit"));
        assert!(check_stop_strings(&many[..MAX_STOP_STRINGS]).is_ok());
        assert!(check_stop_strings(&["x".repeat(MAX_STOP_STRING_BYTES + 1)]).is_err());
        assert!(check_stop_strings(&["x".repeat(MAX_STOP_STRING_BYTES)]).is_ok());
        assert!(check_stop_strings(&[String::new()]).is_err());
    }
}
