//! `ScriptCalls`: a node that refuses functions is called by EVALSHA for `RETRY_FUNCTIONS`, then
//! by FCALL again (an ACL put right, an upgraded Redis), and by EVALSHA again if it still refuses.

use super::*;
use crate::store::redis::send::refuses_functions;
use redis::{ErrorKind, ServerErrorKind};

fn refused() -> RedisError {
    RedisError::from((
        ErrorKind::Server(ServerErrorKind::NoPerm),
        "this user has no permissions to run the 'fcall' command",
    ))
}

#[test]
fn functions_are_tried_again_a_while_after_a_refusal() {
    let calls = ScriptCalls::default();
    let start = Instant::now();
    assert!(!calls.scripts_only_at(start), "functions first");
    assert!(refuses_functions(&refused()));

    calls.keep_to_scripts_at(&refused(), start);
    let second = Duration::from_secs(1);
    assert!(calls.scripts_only_at(start));
    assert!(calls.scripts_only_at(start + RETRY_FUNCTIONS - second));
    assert!(
        !calls.scripts_only_at(start + RETRY_FUNCTIONS + second),
        "FCALL is tried again"
    );

    // Refused again at the retry: EVALSHA for another while, counted from then.
    let again = start + RETRY_FUNCTIONS + second;
    calls.keep_to_scripts_at(&refused(), again);
    assert!(calls.scripts_only_at(again + RETRY_FUNCTIONS - second));
    assert!(!calls.scripts_only_at(again + RETRY_FUNCTIONS + second));
}

#[test]
fn the_readiness_looks_second_run_goes_by_evalsha() {
    let calls = ScriptCalls::scripts_for_now();
    assert!(calls.scripts_only());
}
