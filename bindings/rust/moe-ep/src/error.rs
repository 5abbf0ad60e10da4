//! Status codes and the error type every fallible call returns.
use moe_ep_sys as sys;
use std::ffi::CStr;
use std::fmt;

/// A `moe_ep_status_t`.  A newtype, not an enum: a status this crate does not
/// know (from a newer library) is still representable.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Status(pub i32);

impl Status {
    pub const SUCCESS: Status = Status(sys::MOE_EP_SUCCESS);
    pub const INVALID_ARGUMENT: Status = Status(sys::MOE_EP_ERROR_INVALID_ARGUMENT);
    pub const UNSUPPORTED: Status = Status(sys::MOE_EP_ERROR_UNSUPPORTED);
    pub const CUDA: Status = Status(sys::MOE_EP_ERROR_CUDA);
    pub const BOOTSTRAP: Status = Status(sys::MOE_EP_ERROR_BOOTSTRAP);
    pub const OUT_OF_MEMORY: Status = Status(sys::MOE_EP_ERROR_OUT_OF_MEMORY);
    pub const TIMEOUT: Status = Status(sys::MOE_EP_ERROR_TIMEOUT);
    pub const INVALID_STATE: Status = Status(sys::MOE_EP_ERROR_INVALID_STATE);
    pub const INVALID_INPUT: Status = Status(sys::MOE_EP_ERROR_INVALID_INPUT);
    pub const INTERNAL: Status = Status(sys::MOE_EP_ERROR_INTERNAL);

    /// The library's static name, e.g. "MOE_EP_ERROR_TIMEOUT".
    pub fn name(self) -> &'static str {
        // moe_ep_status_string returns a static, never-NULL string.
        let p = unsafe { sys::moe_ep_status_string(self.0) };
        if p.is_null() {
            return "MOE_EP_<unknown status>";
        }
        unsafe { CStr::from_ptr(p) }.to_str().unwrap_or("MOE_EP_<non-UTF-8 name>")
    }
}

impl fmt::Debug for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}({})", self.name(), self.0)
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A failed call: its status and the library's message (naming the argument,
/// the expected and the actual value).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    pub status: Status,
    pub message: String,
}

impl Error {
    pub fn new(status: Status, message: impl Into<String>) -> Self {
        Error { status, message: message.into() }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.status.name(), self.message)
    }
}

impl std::error::Error for Error {}

pub type Result<T> = std::result::Result<T, Error>;

/// The thread-local message of the last failing call on this thread.
pub(crate) fn last_error() -> String {
    let p = unsafe { sys::moe_ep_last_error() };
    if p.is_null() {
        return String::new();
    }
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// Ok for SUCCESS, else the status with the message, read at once (the next
/// call on this thread overwrites it).
pub(crate) fn check(status: sys::moe_ep_status_t) -> Result<()> {
    if status == sys::MOE_EP_SUCCESS {
        Ok(())
    } else {
        Err(Error { status: Status(status), message: last_error() })
    }
}
