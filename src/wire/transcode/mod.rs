//! JSON to MessagePack and back without value trees, for the in-place
//! decision of JSON results (`decision::fast_json`): a JSON body is read
//! into the canonical MessagePack the in-place decision reads, and its output
//! is written back as JSON.
//!
//! Both directions are exact: a JSON body read here gives the bytes that
//! decoding it into a value tree and writing that as MessagePack would give
//! (and is refused whenever that decode fails), and MessagePack written back
//! gives the bytes [`super::encode`] gives as JSON. What a token-by-token
//! reader costs against the tree is in `docs/performance.md`.

mod from_json;
mod to_json;

pub use from_json::json_to_msgpack;
pub use to_json::msgpack_to_json;
