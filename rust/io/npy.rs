//! NPY parsing: the header is read and checked here, the array data is left
//! where it lies, so the bindings can hand numpy a view of the input.
//!
//! The header is a Python dict literal; numpy reads it with
//! `ast.literal_eval`. A small parser for the subset of Python literals that
//! NPY headers use stands in for it, with a nesting cap so that hostile input
//! cannot exhaust the stack.

use super::error::DecodeError;

const FORMAT: &str = "NPY";

/// Every NPY file starts with these bytes.
pub const NPY_MAGIC: &[u8; 6] = b"\x93NUMPY";

/// numpy's `NPY_MAXDIMS` (64 since numpy 2.0).
const MAX_DIMS: usize = 64;

/// Deep enough for any structured dtype worth refusing politely, shallow
/// enough that the recursive parser cannot overflow the stack.
const MAX_NESTING: usize = 32;

/// How the bytes of one element are ordered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ByteOrder {
    Little,
    Big,
    /// Single-byte types, which numpy marks with `|`.
    NotApplicable,
}

/// The numeric kinds minato reads: numpy's typestr kind letters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DtypeKind {
    Bool,
    Int,
    UInt,
    Float,
    Complex,
}

/// A numeric numpy dtype.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NpyDtype {
    pub kind: DtypeKind,
    pub byte_order: ByteOrder,
    /// Bytes per element.
    pub item_size: usize,
}

impl NpyDtype {
    /// numpy's typestr for this dtype (`<f8`, `|b1`), which `numpy.dtype`
    /// accepts.
    pub fn descr(&self) -> String {
        let order = match self.byte_order {
            ByteOrder::Little => '<',
            ByteOrder::Big => '>',
            ByteOrder::NotApplicable => '|',
        };
        let kind = match self.kind {
            DtypeKind::Bool => 'b',
            DtypeKind::Int => 'i',
            DtypeKind::UInt => 'u',
            DtypeKind::Float => 'f',
            DtypeKind::Complex => 'c',
        };
        format!("{order}{kind}{}", self.item_size)
    }
}

/// What an NPY header says, checked against the data that follows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NpyHeader {
    /// The format version, (1, 0), (2, 0) or (3, 0).
    pub version: (u8, u8),
    pub dtype: NpyDtype,
    pub shape: Vec<usize>,
    pub fortran_order: bool,
    /// Where the array data starts in the input.
    pub data_offset: usize,
    /// Bytes of array data; `data_offset + data_len` is within the input.
    pub data_len: usize,
}

impl NpyHeader {
    /// The number of elements.
    pub fn count(&self) -> usize {
        // Cannot overflow: data_len = count * item_size was computed checked.
        self.data_len / self.dtype.item_size
    }
}

/// Parses an NPY file's header and checks that `data` holds the whole array.
/// Trailing bytes after the array are ignored, as numpy ignores them.
pub fn parse_npy(data: &[u8]) -> Result<NpyHeader, DecodeError> {
    let magic_len = NPY_MAGIC.len();
    if data.len() < magic_len {
        return Err(if NPY_MAGIC.starts_with(data) {
            DecodeError::truncated(FORMAT, "the data ends inside the magic string")
        } else {
            not_npy(data)
        });
    }
    if &data[..magic_len] != NPY_MAGIC {
        return Err(not_npy(data));
    }
    let (major, minor) = match data.get(6..8) {
        Some(&[major, minor]) => (major, minor),
        _ => {
            return Err(DecodeError::truncated(
                FORMAT,
                "the data ends before the format version",
            ))
        }
    };
    // Versions 2.0 and 3.0 have a 4-byte header length; 3.0 headers are UTF-8.
    let length_size = match (major, minor) {
        (1, 0) => 2,
        (2, 0) | (3, 0) => 4,
        _ => {
            return Err(DecodeError::unsupported(
                FORMAT,
                format!("format version {major}.{minor} (minato reads 1.0, 2.0 and 3.0)"),
            ))
        }
    };
    let header_start = 8 + length_size;
    let header_len = match data.get(8..header_start) {
        Some(&[a, b]) => usize::from(u16::from_le_bytes([a, b])),
        Some(&[a, b, c, d]) => to_usize(u64::from(u32::from_le_bytes([a, b, c, d])))?,
        _ => {
            return Err(DecodeError::truncated(
                FORMAT,
                "the data ends before the header length",
            ))
        }
    };
    let header_end = header_start
        .checked_add(header_len)
        .ok_or_else(|| too_big("the header length"))?;
    let header = data.get(header_start..header_end).ok_or_else(|| {
        DecodeError::truncated(
            FORMAT,
            format!(
                "the header is {header_len} bytes, the data ends {} bytes into it",
                data.len() - header_start.min(data.len())
            ),
        )
    })?;
    if major == 3 && std::str::from_utf8(header).is_err() {
        return Err(DecodeError::corrupt(
            FORMAT,
            "a version 3.0 header is not valid UTF-8",
        ));
    }

    let dict = parse_header_literal(header, major <= 2)?;
    let fields = header_fields(dict)?;
    let dtype = parse_descr(&fields.descr)?;
    let shape = parse_shape(&fields.shape)?;
    let fortran_order = match fields.fortran_order {
        Literal::Bool(value) => value,
        other => {
            return Err(DecodeError::corrupt(
                FORMAT,
                format!("fortran_order is not a bool: {}", other.describe()),
            ))
        }
    };
    let data_len = array_bytes(&shape, dtype.item_size)?;
    let available = data.len() - header_end;
    if data_len > available {
        return Err(DecodeError::truncated(
            FORMAT,
            format!("expected {data_len} bytes of array data, got {available}"),
        ));
    }
    Ok(NpyHeader {
        version: (major, minor),
        dtype,
        shape,
        fortran_order,
        data_offset: header_end,
        data_len,
    })
}

fn not_npy(data: &[u8]) -> DecodeError {
    let shown = &data[..data.len().min(NPY_MAGIC.len())];
    DecodeError::corrupt(
        FORMAT,
        format!(
            "not an NPY file: it starts with b'{}', not the magic string b'\\x93NUMPY'",
            shown.escape_ascii()
        ),
    )
}

fn too_big(what: &str) -> DecodeError {
    DecodeError::corrupt(
        FORMAT,
        format!("{what} overflows this machine's address space"),
    )
}

fn to_usize(value: u64) -> Result<usize, DecodeError> {
    usize::try_from(value).map_err(|_| too_big("a length"))
}

/// The array's size in bytes. Like numpy, only the non-zero dimensions must
/// multiply to an addressable size, however large a zero-sized array's
/// other dimensions are.
fn array_bytes(shape: &[usize], item_size: usize) -> Result<usize, DecodeError> {
    let overflow = || DecodeError::corrupt(FORMAT, format!("shape {shape:?} is too large"));
    let mut nonzero_bytes = item_size;
    for &dim in shape.iter().filter(|&&dim| dim != 0) {
        nonzero_bytes = nonzero_bytes.checked_mul(dim).ok_or_else(overflow)?;
    }
    if nonzero_bytes > isize::MAX as usize {
        return Err(overflow());
    }
    Ok(if shape.contains(&0) { 0 } else { nonzero_bytes })
}

/// The three entries of the header dict.
struct HeaderFields {
    descr: Literal,
    fortran_order: Literal,
    shape: Literal,
}

fn header_fields(dict: Literal) -> Result<HeaderFields, DecodeError> {
    let Literal::Dict(entries) = dict else {
        return Err(DecodeError::corrupt(
            FORMAT,
            format!("the header is not a dict but {}", dict.describe()),
        ));
    };
    let (mut descr, mut fortran_order, mut shape) = (None, None, None);
    let mut unknown = Vec::new();
    // Python keeps the last value of a repeated key.
    for (key, value) in entries {
        match &key {
            Literal::Str(name) if name == b"descr" => descr = Some(value),
            Literal::Str(name) if name == b"fortran_order" => fortran_order = Some(value),
            Literal::Str(name) if name == b"shape" => shape = Some(value),
            other => unknown.push(other.describe()),
        }
    }
    match (descr, fortran_order, shape) {
        (Some(descr), Some(fortran_order), Some(shape)) if unknown.is_empty() => Ok(HeaderFields {
            descr,
            fortran_order,
            shape,
        }),
        (descr, fortran_order, shape) => {
            let missing: Vec<&str> = [
                ("'descr'", descr.is_none()),
                ("'fortran_order'", fortran_order.is_none()),
                ("'shape'", shape.is_none()),
            ]
            .into_iter()
            .filter_map(|(name, absent)| absent.then_some(name))
            .collect();
            Err(DecodeError::corrupt(
                FORMAT,
                format!(
                    "the header must have exactly the keys 'descr', 'fortran_order' and \
                     'shape'; missing [{}], unexpected [{}]",
                    missing.join(", "),
                    unknown.join(", ")
                ),
            ))
        }
    }
}

fn parse_shape(shape: &Literal) -> Result<Vec<usize>, DecodeError> {
    let invalid = || {
        DecodeError::corrupt(
            FORMAT,
            format!(
                "shape is not a tuple of non-negative ints: {}",
                shape.describe()
            ),
        )
    };
    let Literal::Tuple(dims) = shape else {
        return Err(invalid());
    };
    if dims.len() > MAX_DIMS {
        return Err(DecodeError::unsupported(
            FORMAT,
            format!("{} dimensions (numpy allows {MAX_DIMS})", dims.len()),
        ));
    }
    dims.iter()
        .map(|dim| match dim {
            Literal::Int(value) => usize::try_from(*value)
                .ok()
                .filter(|&dim| dim <= isize::MAX as usize)
                .ok_or_else(invalid),
            _ => Err(invalid()),
        })
        .collect()
}

/// Reads a numeric typestr (`<f8`, `|b1`, `>c16`); refuses object dtypes
/// (pickles) and everything minato does not read.
fn parse_descr(descr: &Literal) -> Result<NpyDtype, DecodeError> {
    match descr {
        Literal::Str(typestr) => {
            if is_object_typestr(typestr) {
                return Err(DecodeError::ObjectDtype);
            }
            numeric_dtype(typestr).ok_or_else(|| {
                DecodeError::unsupported(
                    FORMAT,
                    format!(
                        "dtype {} (minato reads bool, int8-64, uint8-64, float16/32/64 and \
                         complex64/128)",
                        descr.describe()
                    ),
                )
            })
        }
        Literal::List(_) | Literal::Tuple(_) if descr_has_object(descr, 0) => {
            Err(DecodeError::ObjectDtype)
        }
        Literal::List(_) => Err(DecodeError::unsupported(
            FORMAT,
            "structured dtypes (minato reads plain numeric arrays)",
        )),
        Literal::Tuple(_) => Err(DecodeError::unsupported(
            FORMAT,
            "subarray dtypes (minato reads plain numeric arrays)",
        )),
        other => Err(DecodeError::corrupt(
            FORMAT,
            format!("descr is not a dtype description: {}", other.describe()),
        )),
    }
}

fn numeric_dtype(typestr: &[u8]) -> Option<NpyDtype> {
    let (order, rest) = match typestr.split_first()? {
        (&order @ (b'<' | b'>' | b'|' | b'='), rest) => (order, rest),
        _ => (b'=', typestr),
    };
    let (&kind_letter, digits) = rest.split_first()?;
    let item_size: usize = std::str::from_utf8(digits).ok()?.parse().ok()?;
    let kind = match (kind_letter, item_size) {
        (b'b', 1) => DtypeKind::Bool,
        (b'i', 1 | 2 | 4 | 8) => DtypeKind::Int,
        (b'u', 1 | 2 | 4 | 8) => DtypeKind::UInt,
        (b'f', 2 | 4 | 8) => DtypeKind::Float,
        (b'c', 8 | 16) => DtypeKind::Complex,
        _ => return None,
    };
    // numpy treats '|' on a multi-byte type as native order, like '='.
    let byte_order = match order {
        _ if item_size == 1 => ByteOrder::NotApplicable,
        b'<' => ByteOrder::Little,
        b'>' => ByteOrder::Big,
        _ if cfg!(target_endian = "big") => ByteOrder::Big,
        _ => ByteOrder::Little,
    };
    Some(NpyDtype {
        kind,
        byte_order,
        item_size,
    })
}

/// `O`, `|O`, `<O8`...: numpy's object typestrs.
fn is_object_typestr(typestr: &[u8]) -> bool {
    let rest = match typestr.first() {
        Some(b'<' | b'>' | b'|' | b'=') => &typestr[1..],
        _ => typestr,
    };
    rest.first() == Some(&b'O') && rest[1..].iter().all(u8::is_ascii_digit)
}

/// Whether a structured or subarray descr has an object field anywhere.
fn descr_has_object(descr: &Literal, depth: usize) -> bool {
    if depth > MAX_NESTING {
        return false;
    }
    match descr {
        Literal::Str(typestr) => is_object_typestr(typestr),
        // Fields: (name, type) or (name, type, shape).
        Literal::List(fields) => fields.iter().any(|field| match field {
            Literal::Tuple(parts) if parts.len() >= 2 => descr_has_object(&parts[1], depth + 1),
            _ => false,
        }),
        // A subarray: (type, shape).
        Literal::Tuple(parts) => parts
            .first()
            .is_some_and(|base| descr_has_object(base, depth + 1)),
        _ => false,
    }
}

/// A Python literal as NPY headers write them.
#[derive(Debug, Clone, PartialEq)]
enum Literal {
    /// The raw bytes between the quotes, escapes resolved.
    Str(Vec<u8>),
    Int(i128),
    Bool(bool),
    None,
    Tuple(Vec<Literal>),
    List(Vec<Literal>),
    Dict(Vec<(Literal, Literal)>),
}

impl Literal {
    /// A short rendering for error messages.
    fn describe(&self) -> String {
        let mut text = String::new();
        self.render(&mut text);
        if text.len() > 80 {
            let mut cut = 77;
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            text.truncate(cut);
            text.push_str("...");
        }
        text
    }

    fn render(&self, out: &mut String) {
        // Long literals are cut in describe(); stop rendering early too, so a
        // huge header costs no more than a short one.
        if out.len() > 80 {
            return;
        }
        let join = |out: &mut String, items: &[Literal]| {
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                item.render(out);
            }
        };
        match self {
            Literal::Str(bytes) => {
                out.push('\'');
                out.extend(
                    bytes
                        .iter()
                        .flat_map(|&b| std::ascii::escape_default(b))
                        .map(char::from),
                );
                out.push('\'');
            }
            Literal::Int(value) => out.push_str(&value.to_string()),
            Literal::Bool(true) => out.push_str("True"),
            Literal::Bool(false) => out.push_str("False"),
            Literal::None => out.push_str("None"),
            Literal::Tuple(items) => {
                out.push('(');
                join(out, items);
                if items.len() == 1 {
                    out.push(',');
                }
                out.push(')');
            }
            Literal::List(items) => {
                out.push('[');
                join(out, items);
                out.push(']');
            }
            Literal::Dict(entries) => {
                out.push('{');
                for (i, (key, value)) in entries.iter().enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    key.render(out);
                    out.push_str(": ");
                    value.render(out);
                }
                out.push('}');
            }
        }
    }
}

/// Parses the whole header as one literal followed by whitespace only.
/// `python2_longs` accepts the `3L` ints of headers written by Python 2,
/// which numpy filters out of version 1.0 and 2.0 headers.
fn parse_header_literal(header: &[u8], python2_longs: bool) -> Result<Literal, DecodeError> {
    let mut parser = LiteralParser {
        text: header,
        pos: 0,
        python2_longs,
    };
    let value = parser.value(0)?;
    parser.skip_whitespace();
    if parser.pos != header.len() {
        return Err(parser.error("unexpected text after the header dict"));
    }
    Ok(value)
}

struct LiteralParser<'a> {
    text: &'a [u8],
    pos: usize,
    python2_longs: bool,
}

impl LiteralParser<'_> {
    fn error(&self, what: &str) -> DecodeError {
        let context = &self.text[self.pos.min(self.text.len())..];
        let context = &context[..context.len().min(20)];
        DecodeError::corrupt(
            FORMAT,
            format!(
                "cannot parse the header at byte {}: {what} (near {:?})",
                self.pos,
                String::from_utf8_lossy(context)
            ),
        )
    }

    fn peek(&self) -> Option<u8> {
        self.text.get(self.pos).copied()
    }

    fn skip_whitespace(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r' | b'\x0c')) {
            self.pos += 1;
        }
    }

    fn value(&mut self, depth: usize) -> Result<Literal, DecodeError> {
        if depth > MAX_NESTING {
            return Err(self.error("the header nests too deeply"));
        }
        self.skip_whitespace();
        match self.peek() {
            None => Err(DecodeError::truncated(
                FORMAT,
                "the header ends before its dict does",
            )),
            Some(quote @ (b'\'' | b'"')) => self.string(quote),
            Some(b'0'..=b'9' | b'-' | b'+') => self.int(),
            Some(b'(') => self.sequence(b')', depth).map(|(items, trailing_comma)| {
                // `(x)` is x itself; only a comma makes a one-item tuple.
                if items.len() == 1 && !trailing_comma {
                    items.into_iter().next().unwrap_or(Literal::None)
                } else {
                    Literal::Tuple(items)
                }
            }),
            Some(b'[') => self
                .sequence(b']', depth)
                .map(|(items, _)| Literal::List(items)),
            Some(b'{') => self.dict(depth),
            Some(b'a'..=b'z' | b'A'..=b'Z' | b'_') => self.name(),
            Some(_) => Err(self.error("not a Python literal")),
        }
    }

    fn name(&mut self) -> Result<Literal, DecodeError> {
        let start = self.pos;
        while matches!(
            self.peek(),
            Some(b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'_')
        ) {
            self.pos += 1;
        }
        match &self.text[start..self.pos] {
            b"True" => Ok(Literal::Bool(true)),
            b"False" => Ok(Literal::Bool(false)),
            b"None" => Ok(Literal::None),
            _ => {
                self.pos = start;
                Err(self.error("not a Python literal"))
            }
        }
    }

    fn string(&mut self, quote: u8) -> Result<Literal, DecodeError> {
        self.pos += 1;
        let mut value = Vec::new();
        loop {
            let Some(byte) = self.peek() else {
                return Err(DecodeError::truncated(
                    FORMAT,
                    "the header ends inside a string",
                ));
            };
            self.pos += 1;
            match byte {
                _ if byte == quote => return Ok(Literal::Str(value)),
                b'\n' => {
                    self.pos -= 1;
                    return Err(self.error("a string runs past the end of its line"));
                }
                b'\\' => {
                    let Some(escaped) = self.peek() else {
                        return Err(DecodeError::truncated(
                            FORMAT,
                            "the header ends inside a string",
                        ));
                    };
                    self.pos += 1;
                    value.push(match escaped {
                        b'n' => b'\n',
                        b't' => b'\t',
                        b'r' => b'\r',
                        b'0' => b'\0',
                        // \\, \', \" and anything numpy never writes: the
                        // character itself is close enough for a dtype name.
                        other => other,
                    });
                }
                _ => value.push(byte),
            }
        }
    }

    fn int(&mut self) -> Result<Literal, DecodeError> {
        let negative = match self.peek() {
            Some(b'-') => {
                self.pos += 1;
                true
            }
            Some(b'+') => {
                self.pos += 1;
                false
            }
            _ => false,
        };
        self.skip_whitespace();
        let start = self.pos;
        let mut value: i128 = 0;
        while let Some(digit @ b'0'..=b'9') = self.peek() {
            value = value
                .checked_mul(10)
                .and_then(|value| value.checked_add(i128::from(digit - b'0')))
                .ok_or_else(|| self.error("an integer too large for an array dimension"))?;
            self.pos += 1;
        }
        if self.pos == start {
            return Err(self.error("a sign without a number"));
        }
        if self.python2_longs && self.peek() == Some(b'L') {
            self.pos += 1;
        }
        if matches!(
            self.peek(),
            Some(b'.' | b'e' | b'E' | b'x' | b'X' | b'_' | b'j' | b'J' | b'a'..=b'z' | b'A'..=b'Z')
        ) {
            return Err(self.error("only decimal integers are expected in a header"));
        }
        Ok(Literal::Int(if negative { -value } else { value }))
    }

    /// Items up to `close`; also says whether a comma followed the last one.
    fn sequence(&mut self, close: u8, depth: usize) -> Result<(Vec<Literal>, bool), DecodeError> {
        self.pos += 1;
        let mut items = Vec::new();
        let mut trailing_comma = false;
        loop {
            self.skip_whitespace();
            match self.peek() {
                Some(byte) if byte == close => {
                    self.pos += 1;
                    return Ok((items, trailing_comma));
                }
                None => {
                    return Err(DecodeError::truncated(
                        FORMAT,
                        "the header ends inside a tuple or list",
                    ))
                }
                Some(_) if !items.is_empty() && !trailing_comma => {
                    return Err(self.error("expected a comma"))
                }
                Some(_) => {}
            }
            items.push(self.value(depth + 1)?);
            self.skip_whitespace();
            trailing_comma = self.peek() == Some(b',');
            if trailing_comma {
                self.pos += 1;
            }
        }
    }

    fn dict(&mut self, depth: usize) -> Result<Literal, DecodeError> {
        self.pos += 1;
        let mut entries = Vec::new();
        let mut after_comma = true;
        loop {
            self.skip_whitespace();
            match self.peek() {
                Some(b'}') => {
                    self.pos += 1;
                    return Ok(Literal::Dict(entries));
                }
                None => {
                    return Err(DecodeError::truncated(
                        FORMAT,
                        "the header ends inside its dict",
                    ))
                }
                Some(_) if !after_comma => return Err(self.error("expected a comma")),
                Some(_) => {}
            }
            let key = self.value(depth + 1)?;
            self.skip_whitespace();
            match self.peek() {
                Some(b':') => self.pos += 1,
                None => {
                    return Err(DecodeError::truncated(
                        FORMAT,
                        "the header ends inside its dict",
                    ))
                }
                Some(_) => return Err(self.error("expected a colon")),
            }
            let value = self.value(depth + 1)?;
            entries.push((key, value));
            self.skip_whitespace();
            after_comma = self.peek() == Some(b',');
            if after_comma {
                self.pos += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An NPY file as numpy writes it: header padded with spaces to a
    /// multiple of 64 bytes, ending in a newline.
    fn npy(version: u8, header: &str, data: &[u8]) -> Vec<u8> {
        let length_size = if version == 1 { 2 } else { 4 };
        let unpadded = 8 + length_size + header.len() + 1;
        let padded = unpadded.div_ceil(64) * 64;
        let mut text = header.as_bytes().to_vec();
        text.resize(padded - 8 - length_size - 1, b' ');
        text.push(b'\n');
        let mut out = NPY_MAGIC.to_vec();
        out.extend([version, 0]);
        if version == 1 {
            out.extend((text.len() as u16).to_le_bytes());
        } else {
            out.extend((text.len() as u32).to_le_bytes());
        }
        out.extend(text);
        out.extend(data);
        out
    }

    fn header(descr: &str, fortran: bool, shape: &str) -> String {
        let fortran = if fortran { "True" } else { "False" };
        format!("{{'descr': '{descr}', 'fortran_order': {fortran}, 'shape': {shape}, }}")
    }

    #[test]
    fn reads_a_numpy_header() {
        let data = npy(1, &header("<f8", false, "(2, 3)"), &[0; 48]);
        let parsed = parse_npy(&data).unwrap();
        assert_eq!(parsed.version, (1, 0));
        assert_eq!(parsed.dtype.descr(), "<f8");
        assert_eq!(parsed.shape, vec![2, 3]);
        assert!(!parsed.fortran_order);
        assert_eq!(parsed.data_offset, data.len() - 48);
        assert_eq!(parsed.data_offset % 64, 0);
        assert_eq!(parsed.data_len, 48);
        assert_eq!(parsed.count(), 6);
    }

    #[test]
    fn reads_versions_2_and_3() {
        for version in [2, 3] {
            let data = npy(version, &header(">i2", true, "(3,)"), &[0; 6]);
            let parsed = parse_npy(&data).unwrap();
            assert_eq!(parsed.version, (version, 0));
            assert_eq!(parsed.dtype.descr(), ">i2");
            assert_eq!(parsed.shape, vec![3]);
            assert!(parsed.fortran_order);
        }
    }

    #[test]
    fn reads_scalars_and_empty_arrays() {
        let parsed = parse_npy(&npy(1, &header("|b1", false, "()"), &[1])).unwrap();
        assert_eq!((parsed.shape.len(), parsed.data_len), (0, 1));
        let parsed = parse_npy(&npy(1, &header("<c16", false, "(0, 5)"), &[])).unwrap();
        assert_eq!((parsed.shape, parsed.data_len), (vec![0, 5], 0));
        // Large dimensions next to a zero are fine, as in numpy, as long as
        // the others make an addressable size.
        let shape = format!("({}, 0, {})", 1u64 << 28, 1u64 << 28);
        let parsed = parse_npy(&npy(1, &header("<f8", false, &shape), &[])).unwrap();
        assert_eq!(parsed.data_len, 0);
        let shape = format!("({}, 0)", isize::MAX);
        assert!(parse_npy(&npy(1, &header("<f8", false, &shape), &[])).is_err());
    }

    #[test]
    fn reads_python2_headers() {
        let text = "{'descr': '<u4', 'fortran_order': False, 'shape': (2L, 1L)}";
        assert_eq!(parse_npy(&npy(1, text, &[0; 8])).unwrap().shape, vec![2, 1]);
        assert!(parse_npy(&npy(3, text, &[0; 8])).is_err());
    }

    #[test]
    fn accepts_literal_variations() {
        for text in [
            "{\"shape\": (4,), \"fortran_order\": False, \"descr\": \"<i4\"}",
            "  {'descr':'<i4','fortran_order':False,'shape':(4 ,) ,}\t",
            "{'descr': '<i4', 'fortran_order': False, 'shape': ((4),)}",
        ] {
            assert_eq!(
                parse_npy(&npy(1, text, &[0; 16])).unwrap().count(),
                4,
                "{text}"
            );
        }
        // A repeated key keeps its last value, as in Python.
        let text = "{'descr': '<i8', 'descr': '<i4', 'fortran_order': False, 'shape': (4,)}";
        assert_eq!(
            parse_npy(&npy(1, text, &[0; 16])).unwrap().dtype.item_size,
            4
        );
    }

    #[test]
    fn refuses_object_arrays() {
        for descr in ["|O", "O", "<O8"] {
            let data = npy(1, &header(descr, false, "(1,)"), &[0x80, 2]);
            assert_eq!(parse_npy(&data), Err(DecodeError::ObjectDtype));
        }
        let text = "{'descr': [('a', '<i4'), ('b', '|O')], 'fortran_order': False, 'shape': (1,)}";
        assert_eq!(
            parse_npy(&npy(1, text, &[0; 12])),
            Err(DecodeError::ObjectDtype)
        );
        let text = "{'descr': [('O', '<i4')], 'fortran_order': False, 'shape': (1,)}";
        assert!(matches!(
            parse_npy(&npy(1, text, &[0; 4])),
            Err(DecodeError::Unsupported { .. })
        ));
    }

    #[test]
    fn refuses_other_dtypes() {
        for descr in ["<U3", "|S4", "<M8[ns]", "<f16", "<i3", "", "<", "<f"] {
            let data = npy(1, &header(descr, false, "(1,)"), &[0; 64]);
            assert!(
                matches!(parse_npy(&data), Err(DecodeError::Unsupported { .. })),
                "{descr}: {:?}",
                parse_npy(&data)
            );
        }
    }

    #[test]
    fn refuses_bad_headers() {
        for text in [
            "{'descr': '<f8', 'fortran_order': False}",
            "{'descr': '<f8', 'fortran_order': False, 'shape': (1,), 'x': 1}",
            "{'descr': '<f8', 'fortran_order': 0, 'shape': (1,)}",
            "{'descr': '<f8', 'fortran_order': False, 'shape': (-1,)}",
            "{'descr': '<f8', 'fortran_order': False, 'shape': (1.5,)}",
            "{'descr': '<f8', 'fortran_order': False, 'shape': 1}",
            "{'descr': '<f8', 'fortran_order': False, 'shape': (1)}",
            "{'descr': '<f8', 'fortran_order': False, 'shape': (1 2)}",
            "{'descr': '<f8', 'fortran_order': False, 'shape': (1,)} x",
            "{'descr': '<f8' 'fortran_order': False, 'shape': (1,)}",
            "['descr']",
            "",
        ] {
            let result = parse_npy(&npy(1, text, &[0; 8]));
            assert!(
                matches!(
                    result,
                    Err(DecodeError::Corrupt { .. } | DecodeError::Truncated { .. })
                ),
                "{text}: {result:?}"
            );
        }
    }

    #[test]
    fn refuses_shapes_beyond_memory() {
        let shape = format!("({}, {})", 1u64 << 40, 1u64 << 40);
        let result = parse_npy(&npy(1, &header("<f8", false, &shape), &[]));
        assert!(
            matches!(result, Err(DecodeError::Corrupt { .. })),
            "{result:?}"
        );
        let shape = format!("({}0,)", u128::MAX);
        let result = parse_npy(&npy(1, &header("<f8", false, &shape), &[]));
        assert!(
            matches!(result, Err(DecodeError::Corrupt { .. })),
            "{result:?}"
        );
        let shape = format!("({})", "1, ".repeat(65));
        let result = parse_npy(&npy(1, &header("<f8", false, &shape), &[0; 8]));
        assert!(
            matches!(result, Err(DecodeError::Unsupported { .. })),
            "{result:?}"
        );
    }

    #[test]
    fn deep_nesting_is_an_error_not_a_stack_overflow() {
        let text = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        let result = parse_npy(&npy(2, &text, &[]));
        assert!(
            matches!(result, Err(DecodeError::Corrupt { .. })),
            "{result:?}"
        );
    }

    #[test]
    fn every_truncation_is_an_error() {
        let data = npy(1, &header("<i2", false, "(3,)"), &[1, 0, 2, 0, 3, 0]);
        assert!(parse_npy(&data).is_ok());
        for cut in 0..data.len() {
            let result = parse_npy(&data[..cut]);
            assert!(
                matches!(
                    result,
                    Err(DecodeError::Truncated { .. } | DecodeError::Corrupt { .. })
                ),
                "cut at {cut}: {result:?}"
            );
        }
    }

    #[test]
    fn refuses_other_formats_and_versions() {
        assert!(matches!(
            parse_npy(b"PK\x03\x04"),
            Err(DecodeError::Corrupt { .. })
        ));
        assert!(matches!(
            parse_npy(b"\x80\x04\x95"),
            Err(DecodeError::Corrupt { .. })
        ));
        assert!(matches!(parse_npy(b""), Err(DecodeError::Truncated { .. })));
        let mut data = npy(1, &header("<f8", false, "()"), &[0; 8]);
        data[6] = 4;
        assert!(matches!(
            parse_npy(&data),
            Err(DecodeError::Unsupported { .. })
        ));
    }

    #[test]
    fn version_3_headers_must_be_utf8() {
        let text = "{'descr': '<f8', 'fortran_order': False, 'shape': (), '\u{e9}': 1}";
        let mut data = npy(3, text, &[0; 8]);
        let at = data.iter().position(|&b| b == 0xc3).unwrap();
        data[at] = 0xff;
        let result = parse_npy(&data);
        assert!(
            matches!(result, Err(DecodeError::Corrupt { .. })),
            "{result:?}"
        );
    }
}
