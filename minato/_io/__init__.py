"""The Python side of minato.io's decoders (the work is Rust's: the
extension, ``minato._minato``). Imports only the extension."""
