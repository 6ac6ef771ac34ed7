//! Events with the Go kubelet's reasons and messages: about pods (`pod`: Pulled, Created,
//! Started, Killing, BackOff, …) and about the Node (`node`: NodeReady, Rebooted, image GC
//! failures, …). Every event is a structured log line; in cluster mode it is also an Event in
//! the API server.

mod correlator;
pub mod node;
pub mod pod;

pub use pod::Recorder;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventType {
    Normal,
    Warning,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Normal => "Normal",
            EventType::Warning => "Warning",
        }
    }
}

/// An event about the Node, with upstream's reason and message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeEvent {
    pub type_: EventType,
    pub reason: String,
    pub message: String,
}
