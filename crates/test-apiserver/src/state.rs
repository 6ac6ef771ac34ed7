//! State shared by every connection and request: the store, credentials, hooks, and the
//! current serving epoch (cancelled by `stop()`, which ends open watches).

use std::sync::{Arc, Mutex, RwLock};

use tokio_util::sync::CancellationToken;

use crate::accounting::Accounting;
use crate::faults::Faults;
use crate::pki::Pki;
use crate::store::Store;
use crate::tokens::Tokens;
use crate::{AccessRequest, Decision, UserInfo};

pub type TokenReviewHook = Arc<dyn Fn(&str, &[String]) -> Option<UserInfo> + Send + Sync>;
pub type AuthorizerHook = Arc<dyn Fn(&AccessRequest) -> Decision + Send + Sync>;

#[derive(Default, Clone)]
pub struct Hooks {
    pub token_review: Option<TokenReviewHook>,
    pub authorizer: Option<AuthorizerHook>,
}

pub struct State {
    pub store: Store,
    pub pki: Pki,
    pub tokens: Tokens,
    pub hooks: RwLock<Hooks>,
    /// Requests and open watches, counted as they arrive.
    pub accounting: Accounting,
    /// The faults a test injects.
    pub faults: Faults,
    epoch: Mutex<CancellationToken>,
    /// The in-process signer's certificate lifetime (`--cluster-signing-duration`).
    signing_duration: Mutex<std::time::Duration>,
}

impl State {
    pub fn new(store: Store, pki: Pki, tokens: Tokens) -> State {
        State {
            store,
            pki,
            tokens,
            hooks: RwLock::new(Hooks::default()),
            accounting: Accounting::default(),
            faults: Faults::default(),
            epoch: Mutex::new(CancellationToken::new()),
            signing_duration: Mutex::new(crate::csr::DEFAULT_SIGNING_DURATION),
        }
    }

    pub fn signing_duration(&self) -> std::time::Duration {
        *self.signing_duration.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn set_signing_duration(&self, ttl: std::time::Duration) {
        *self.signing_duration.lock().unwrap_or_else(|p| p.into_inner()) = ttl;
    }

    pub fn hooks(&self) -> Hooks {
        self.hooks.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The token cancelled when the current serving period ends.
    pub fn epoch(&self) -> CancellationToken {
        self.epoch.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Ends the current serving period and starts a new one.
    pub fn next_epoch(&self) -> CancellationToken {
        let mut epoch = self.epoch.lock().unwrap_or_else(|p| p.into_inner());
        epoch.cancel();
        *epoch = CancellationToken::new();
        epoch.clone()
    }

    pub fn cancel_epoch(&self) {
        self.epoch.lock().unwrap_or_else(|p| p.into_inner()).cancel();
    }
}
