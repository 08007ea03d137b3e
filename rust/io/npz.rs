//! NPZ parsing: a ZIP archive of NPY members, read as Python's `zipfile`
//! and `numpy.load` read it (the same keys, the same member chosen for a
//! repeated name, the same CRC check), with every offset checked and the
//! inflated size capped. Stored members are left in place as offsets into
//! the input; deflated ones are inflated into buffers of their declared size.

use std::collections::{HashMap, HashSet};

use miniz_oxide::inflate::core::{decompress, inflate_flags, DecompressorOxide};
use miniz_oxide::inflate::TINFLStatus;

use super::error::DecodeError;
use super::npy::{parse_npy, NpyHeader, NPY_MAGIC};

const FORMAT: &str = "NPZ";

/// The default cap on the bytes that inflating an archive's members may
/// allocate, in total: 4 GiB.
pub const DEFAULT_MAX_BYTES: u64 = 1 << 32;

/// Deflate cannot expand one byte into more than 1032 (one 258-byte match per
/// two bits); a member that claims more is corrupt, and refusing it before
/// allocating keeps a tiny hostile archive from asking for gigabytes.
const MAX_DEFLATE_RATIO: u64 = 1032;
/// Headroom for the block headers of tiny members.
const DEFLATE_SLACK: u64 = 1024;

const LOCAL_HEADER_SIGNATURE: &[u8; 4] = b"PK\x03\x04";
const CENTRAL_HEADER_SIGNATURE: &[u8; 4] = b"PK\x01\x02";
const END_SIGNATURE: &[u8; 4] = b"PK\x05\x06";
const ZIP64_END_SIGNATURE: &[u8; 4] = b"PK\x06\x06";
const ZIP64_LOCATOR_SIGNATURE: &[u8; 4] = b"PK\x06\x07";
const LOCAL_HEADER_SIZE: usize = 30;
const CENTRAL_HEADER_SIZE: usize = 46;
const END_SIZE: usize = 22;
const ZIP64_END_SIZE: usize = 56;
const ZIP64_LOCATOR_SIZE: usize = 20;
/// How far back from the end zipfile looks for the end record (a comment
/// is at most 0xFFFF bytes).
const END_SEARCH_WINDOW: usize = END_SIZE + (1 << 16);
/// zipfile's MAX_EXTRACT_VERSION: ZIP 6.3.
const MAX_EXTRACT_VERSION: u8 = 63;

const FLAG_ENCRYPTED: u16 = 1 << 0;
const FLAG_COMPRESSED_PATCH: u16 = 1 << 5;
const FLAG_STRONG_ENCRYPTION: u16 = 1 << 6;
const FLAG_UTF8_NAME: u16 = 1 << 11;

const METHOD_STORED: u16 = 0;
const METHOD_DEFLATED: u16 = 8;

/// How [`parse_npz`] treats its input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NpzOptions {
    /// The most bytes that inflating deflated members may allocate, in total.
    pub max_bytes: u64,
    /// Whether to check each member's CRC-32, as zipfile does.
    pub check_crc: bool,
}

impl Default for NpzOptions {
    fn default() -> Self {
        NpzOptions {
            max_bytes: DEFAULT_MAX_BYTES,
            check_crc: true,
        }
    }
}

/// Where a member's bytes are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MemberData {
    /// Stored without compression: `len` bytes at `offset` in the archive.
    Stored { offset: usize, len: usize },
    /// Deflated, and inflated here.
    Inflated(Vec<u8>),
}

/// One entry of the dict that `numpy.load` would give for the archive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NpzMember {
    /// The dict key: the member's name without its `.npy` suffix.
    pub key: String,
    /// The member's name in the archive.
    pub name: String,
    pub data: MemberData,
    /// The NPY header when the member is an NPY file (its offsets relative to
    /// the member's bytes); `None` for another file, which numpy returns as
    /// raw bytes.
    pub array: Option<NpyHeader>,
}

impl NpzMember {
    /// The member's bytes; `archive` is what was given to [`parse_npz`].
    pub fn bytes<'a>(&'a self, archive: &'a [u8]) -> &'a [u8] {
        match &self.data {
            MemberData::Stored { offset, len } => &archive[*offset..*offset + *len],
            MemberData::Inflated(bytes) => bytes,
        }
    }
}

/// Reads an NPZ archive: the members that `dict(numpy.load(data))` would
/// give, in its order. NPY members are parsed (object arrays refused);
/// deflated members are inflated, at most `options.max_bytes` in total.
pub fn parse_npz(data: &[u8], options: &NpzOptions) -> Result<Vec<NpzMember>, DecodeError> {
    // numpy.load only takes data for a ZIP archive when it starts like one
    // (an empty archive is just its end record).
    if !(data.starts_with(LOCAL_HEADER_SIGNATURE) || data.starts_with(END_SIGNATURE)) {
        return Err(
            if data.len() < 4
                && (LOCAL_HEADER_SIGNATURE.starts_with(data) || END_SIGNATURE.starts_with(data))
            {
                DecodeError::truncated(FORMAT, "the data ends inside the ZIP signature")
            } else {
                DecodeError::corrupt(
                    FORMAT,
                    format!(
                        "not a ZIP archive: it starts with b'{}', not b'PK\\x03\\x04'",
                        data[..data.len().min(4)].escape_ascii()
                    ),
                )
            },
        );
    }
    let entries = central_directory(data)?;

    // numpy.load's keys: names without ".npy", in the archive's order; a key
    // that is itself a member's name means that member; zipfile opens the
    // last member of a repeated name.
    let mut last_by_name: HashMap<&str, &Entry> = HashMap::new();
    let mut name_by_key: HashMap<&str, &str> = HashMap::new();
    for entry in &entries {
        last_by_name.insert(&entry.name, entry);
        name_by_key.insert(npz_key(&entry.name), &entry.name);
    }
    let mut seen = HashSet::new();
    let mut chosen = Vec::new();
    for entry in &entries {
        let key = npz_key(&entry.name);
        if seen.insert(key) {
            let name = if last_by_name.contains_key(key) {
                key
            } else {
                name_by_key[key]
            };
            chosen.push((key, last_by_name[name]));
        }
    }

    // The whole archive's inflated size is known up front: refuse it before
    // inflating anything.
    let inflated_bytes = chosen
        .iter()
        .filter(|(_, entry)| entry.method == METHOD_DEFLATED)
        .fold(0u64, |total, (_, entry)| total.saturating_add(entry.size));
    if inflated_bytes > options.max_bytes {
        return Err(DecodeError::TooManyBytes {
            format: FORMAT,
            bytes: inflated_bytes,
            limit: options.max_bytes,
        });
    }

    let mut members = Vec::with_capacity(chosen.len());
    for (key, entry) in chosen {
        let mut member = NpzMember {
            key: key.to_owned(),
            name: entry.name.clone(),
            data: read_member(data, entry, options)?,
            array: None,
        };
        let bytes = member.bytes(data);
        if bytes.starts_with(NPY_MAGIC) {
            member.array = Some(parse_npy(bytes).map_err(|err| in_member(&entry.name, err))?);
        }
        members.push(member);
    }
    Ok(members)
}

/// numpy's key for a member: its name without the `.npy` suffix.
fn npz_key(name: &str) -> &str {
    name.strip_suffix(".npy").unwrap_or(name)
}

/// Names the member in an NPY error, which then concerns the NPZ archive.
fn in_member(name: &str, err: DecodeError) -> DecodeError {
    match err {
        DecodeError::Truncated { reason, .. } => {
            DecodeError::truncated(FORMAT, format!("member '{name}': {reason}"))
        }
        DecodeError::Corrupt { reason, .. } => {
            DecodeError::corrupt(FORMAT, format!("member '{name}': {reason}"))
        }
        DecodeError::Unsupported { reason, .. } => {
            DecodeError::unsupported(FORMAT, format!("member '{name}': {reason}"))
        }
        other => other,
    }
}

/// A member as the central directory describes it.
#[derive(Debug)]
struct Entry {
    /// The name as stored (zipfile's `orig_filename`), checked against the
    /// local header's.
    stored_name: String,
    /// The name up to any NUL, as zipfile shows it.
    name: String,
    flags: u16,
    method: u16,
    crc: u32,
    compressed_size: u64,
    size: u64,
    /// Where the local header is in the input (already adjusted for data
    /// prepended to the archive).
    header_offset: i128,
}

/// Bytes `start..start + len` of `data`, if they are all there.
fn bytes_at(data: &[u8], start: usize, len: usize) -> Option<&[u8]> {
    data.get(start..start.checked_add(len)?)
}

// Fields of a record at fixed offsets: callers take the record as a slice of
// its full size first, so these indices are always in bounds.
fn le16(record: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([record[at], record[at + 1]])
}

fn le32(record: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([record[at], record[at + 1], record[at + 2], record[at + 3]])
}

fn le64(record: &[u8], at: usize) -> u64 {
    u64::from(le32(record, at)) | u64::from(le32(record, at + 4)) << 32
}

fn truncated(what: &str) -> DecodeError {
    DecodeError::truncated(FORMAT, format!("the data ends inside {what}"))
}

fn to_usize(value: i128, what: &str) -> Result<usize, DecodeError> {
    usize::try_from(value)
        .map_err(|_| DecodeError::corrupt(FORMAT, format!("{what} ({value}) is out of range")))
}

/// Where the end of central directory record is: at the very end when there
/// is no archive comment, else the last signature within a comment's reach
/// (zipfile's `_EndRecData`).
fn find_end_record(data: &[u8]) -> Option<usize> {
    let len = data.len();
    if let Some(at) = len.checked_sub(END_SIZE) {
        if data[at..].starts_with(END_SIGNATURE) && data[len - 2..] == [0, 0] {
            return Some(at);
        }
    }
    let window_start = len.saturating_sub(END_SEARCH_WINDOW);
    let found = data[window_start..]
        .windows(4)
        .rposition(|window| window == END_SIGNATURE)?;
    let at = window_start + found;
    // zipfile gives up when the last signature has no room for its record.
    bytes_at(data, at, END_SIZE).map(|_| at)
}

/// The central directory's entries, in order.
fn central_directory(data: &[u8]) -> Result<Vec<Entry>, DecodeError> {
    let end = find_end_record(data).ok_or_else(|| {
        DecodeError::truncated(
            FORMAT,
            "no end of central directory record: the archive is cut short",
        )
    })?;
    let record = bytes_at(data, end, END_SIZE).ok_or_else(|| truncated("the end record"))?;
    let mut directory_size = u64::from(le32(record, 12));
    let mut directory_offset = u64::from(le32(record, 16));

    // A ZIP64 end record sits right before its locator, which sits right
    // before the end record; numpy writes them for large archives.
    let mut zip64 = false;
    let locator = end
        .checked_sub(ZIP64_LOCATOR_SIZE)
        .and_then(|at| bytes_at(data, at, ZIP64_LOCATOR_SIZE));
    if let Some(locator) = locator.filter(|locator| locator.starts_with(ZIP64_LOCATOR_SIGNATURE)) {
        let (disk, disks) = (le32(locator, 4), le32(locator, 16));
        if disk != 0 || disks > 1 {
            return Err(DecodeError::unsupported(
                FORMAT,
                "archives that span multiple disks",
            ));
        }
        let record = end
            .checked_sub(ZIP64_LOCATOR_SIZE + ZIP64_END_SIZE)
            .and_then(|at| bytes_at(data, at, ZIP64_END_SIZE));
        if let Some(record) = record.filter(|record| record.starts_with(ZIP64_END_SIGNATURE)) {
            zip64 = true;
            directory_size = le64(record, 40);
            directory_offset = le64(record, 48);
        }
    }

    // Data prepended to the archive shifts every offset by `concat`.
    let zip64_records = if zip64 {
        ZIP64_END_SIZE + ZIP64_LOCATOR_SIZE
    } else {
        0
    };
    let concat = end as i128
        - i128::from(directory_size)
        - i128::from(directory_offset)
        - zip64_records as i128;
    let directory_start = to_usize(
        i128::from(directory_offset) + concat,
        "the central directory's offset",
    )?;
    let directory_len = to_usize(i128::from(directory_size), "the central directory's size")?;
    let directory = bytes_at(data, directory_start, directory_len)
        .ok_or_else(|| truncated("the central directory"))?;

    let mut entries = Vec::new();
    let mut pos = 0usize;
    while pos < directory.len() {
        let header = bytes_at(directory, pos, CENTRAL_HEADER_SIZE)
            .ok_or_else(|| truncated("the central directory"))?;
        if !header.starts_with(CENTRAL_HEADER_SIGNATURE) {
            return Err(DecodeError::corrupt(
                FORMAT,
                format!("bad signature for a central directory entry at offset {pos}"),
            ));
        }
        let extract_version = header[6];
        let flags = le16(header, 8);
        let method = le16(header, 10);
        let crc = le32(header, 16);
        let mut compressed_size = u64::from(le32(header, 20));
        let mut size = u64::from(le32(header, 24));
        let name_len = usize::from(le16(header, 28));
        let extra_len = usize::from(le16(header, 30));
        let comment_len = usize::from(le16(header, 32));
        let mut header_offset = u64::from(le32(header, 42));

        // At most 46 + 3 * 0xFFFF bytes: the sum cannot overflow.
        let entry_len = CENTRAL_HEADER_SIZE + name_len + extra_len + comment_len;
        let entry = bytes_at(directory, pos, entry_len)
            .ok_or_else(|| truncated("the central directory"))?;
        let (raw_name, rest) = entry[CENTRAL_HEADER_SIZE..].split_at(name_len);
        let extra = &rest[..extra_len];
        // In bounds: bytes_at found the whole entry there.
        pos += entry_len;

        let stored_name = decode_name(raw_name, flags)?;
        if extract_version > MAX_EXTRACT_VERSION {
            return Err(DecodeError::unsupported(
                FORMAT,
                format!(
                    "member '{stored_name}' needs ZIP version {}.{}",
                    extract_version / 10,
                    extract_version % 10
                ),
            ));
        }
        read_zip64_extra(extra, &mut size, &mut compressed_size, &mut header_offset).map_err(
            |reason| DecodeError::corrupt(FORMAT, format!("member '{stored_name}': {reason}")),
        )?;
        let name = stored_name
            .split('\0')
            .next()
            .unwrap_or_default()
            .to_owned();
        entries.push(Entry {
            stored_name,
            name,
            flags,
            method,
            crc,
            compressed_size,
            size,
            header_offset: i128::from(header_offset) + concat,
        });
    }
    Ok(entries)
}

/// A name as zipfile decodes it: UTF-8 when flagged so, else code page 437.
fn decode_name(raw: &[u8], flags: u16) -> Result<String, DecodeError> {
    if flags & FLAG_UTF8_NAME != 0 {
        return String::from_utf8(raw.to_vec()).map_err(|_| {
            DecodeError::corrupt(FORMAT, "a member name flagged as UTF-8 is not UTF-8")
        });
    }
    Ok(raw
        .iter()
        .map(|&byte| match byte {
            0..=127 => char::from(byte),
            _ => CP437_HIGH[usize::from(byte - 128)],
        })
        .collect())
}

/// Applies the ZIP64 extra field: full sizes and offset for the fields that
/// hold 0xFFFFFFFF, in that order (zipfile's `_decodeExtra`).
fn read_zip64_extra(
    mut extra: &[u8],
    size: &mut u64,
    compressed_size: &mut u64,
    header_offset: &mut u64,
) -> Result<(), String> {
    const SATURATED: u64 = 0xFFFF_FFFF;
    while extra.len() >= 4 {
        let kind = le16(extra, 0);
        let len = usize::from(le16(extra, 2));
        let Some(mut field) = extra.get(4..4 + len) else {
            return Err(format!("corrupt extra field {kind:04x} (size {len})"));
        };
        if kind == 0x0001 {
            for (value, what) in [
                (&mut *size, "file size"),
                (&mut *compressed_size, "compressed size"),
                (&mut *header_offset, "header offset"),
            ] {
                if *value == SATURATED {
                    let Some(full) = field.get(..8) else {
                        return Err(format!("corrupt ZIP64 extra field: no {what}"));
                    };
                    *value = le64(full, 0);
                    field = &field[8..];
                }
            }
        }
        extra = &extra[4 + len..];
    }
    Ok(())
}

/// Finds a member's bytes through its local header, inflating them if need
/// be, and checks them against the CRC-32.
fn read_member(
    data: &[u8],
    entry: &Entry,
    options: &NpzOptions,
) -> Result<MemberData, DecodeError> {
    let name = &entry.name;
    let corrupt =
        |reason: String| DecodeError::corrupt(FORMAT, format!("member '{name}': {reason}"));
    let unsupported =
        |reason: &str| DecodeError::unsupported(FORMAT, format!("member '{name}': {reason}"));
    let truncated_in = |what: &str| {
        DecodeError::truncated(
            FORMAT,
            format!("member '{name}': the data ends inside {what}"),
        )
    };

    let offset = to_usize(entry.header_offset, "a local header's offset")?;
    let header = bytes_at(data, offset, LOCAL_HEADER_SIZE)
        .ok_or_else(|| truncated_in("its local header"))?;
    if !header.starts_with(LOCAL_HEADER_SIGNATURE) {
        return Err(corrupt(format!(
            "bad signature for the local header at offset {offset}"
        )));
    }
    let local_flags = le16(header, 6);
    let name_len = usize::from(le16(header, 26));
    let extra_len = usize::from(le16(header, 28));
    // At most 30 + 2 * 0xFFFF bytes: the sum cannot overflow.
    let header_len = LOCAL_HEADER_SIZE + name_len + extra_len;
    let header =
        bytes_at(data, offset, header_len).ok_or_else(|| truncated_in("its local header"))?;
    let local_name = &header[LOCAL_HEADER_SIZE..LOCAL_HEADER_SIZE + name_len];

    if entry.flags & FLAG_COMPRESSED_PATCH != 0 {
        return Err(unsupported("compressed patched data (flag bit 5)"));
    }
    if entry.flags & FLAG_STRONG_ENCRYPTION != 0 || entry.flags & FLAG_ENCRYPTED != 0 {
        return Err(unsupported("encrypted members"));
    }
    if decode_name(local_name, local_flags)? != entry.stored_name {
        return Err(corrupt(format!(
            "the local header names it {:?}",
            String::from_utf8_lossy(local_name)
        )));
    }

    // In bounds: bytes_at found the whole header there.
    let data_start = offset + header_len;
    let compressed_len = to_usize(i128::from(entry.compressed_size), "a compressed size")?;
    let compressed = bytes_at(data, data_start, compressed_len).ok_or_else(|| {
        DecodeError::truncated(
            FORMAT,
            format!("member '{name}': its {compressed_len} bytes of data run past the end"),
        )
    })?;

    let (member, bytes_for_crc) = match entry.method {
        METHOD_STORED => {
            if entry.compressed_size != entry.size {
                return Err(corrupt(format!(
                    "stored, yet {} bytes long compressed and {} bytes uncompressed",
                    entry.compressed_size, entry.size
                )));
            }
            let member = MemberData::Stored {
                offset: data_start,
                len: compressed_len,
            };
            (member, compressed)
        }
        METHOD_DEFLATED => {
            let most = entry
                .compressed_size
                .saturating_mul(MAX_DEFLATE_RATIO)
                .saturating_add(DEFLATE_SLACK);
            if entry.size > most {
                return Err(corrupt(format!(
                    "declares {} bytes inflated from {} compressed bytes, more than \
                     deflate can produce",
                    entry.size, entry.compressed_size
                )));
            }
            let size = to_usize(i128::from(entry.size), "an uncompressed size")?;
            let inflated = inflate(compressed, size).map_err(|err| in_member(name, err))?;
            return check_crc(options, entry, &inflated).map(|()| MemberData::Inflated(inflated));
        }
        12 => {
            return Err(unsupported(
                "bzip2 compression (minato reads stored and deflated members)",
            ))
        }
        14 => {
            return Err(unsupported(
                "LZMA compression (minato reads stored and deflated members)",
            ))
        }
        other => {
            return Err(unsupported(&format!(
                "compression method {other} (minato reads stored and deflated members)"
            )))
        }
    };
    check_crc(options, entry, bytes_for_crc)?;
    Ok(member)
}

fn check_crc(options: &NpzOptions, entry: &Entry, bytes: &[u8]) -> Result<(), DecodeError> {
    if options.check_crc {
        let actual = crc32(bytes);
        if actual != entry.crc {
            return Err(DecodeError::corrupt(
                FORMAT,
                format!(
                    "member '{}': bad CRC-32 ({actual:08x}, the archive says {:08x})",
                    entry.name, entry.crc
                ),
            ));
        }
    }
    Ok(())
}

/// Inflates raw deflate data into exactly `size` bytes: more or fewer is an
/// error, so nothing beyond the declared (and capped) size is allocated.
fn inflate(compressed: &[u8], size: usize) -> Result<Vec<u8>, DecodeError> {
    let mut out = vec![0u8; size];
    let mut decompressor = Box::<DecompressorOxide>::default();
    // All the input is here and the output buffer holds the whole result.
    let flags = inflate_flags::TINFL_FLAG_USING_NON_WRAPPING_OUTPUT_BUF;
    let (status, _, written) = decompress(&mut decompressor, compressed, &mut out, 0, flags);
    match status {
        TINFLStatus::Done if written == size => Ok(out),
        TINFLStatus::Done => Err(DecodeError::corrupt(
            FORMAT,
            format!("inflates to {written} bytes, not the {size} its header declares"),
        )),
        TINFLStatus::HasMoreOutput => Err(DecodeError::corrupt(
            FORMAT,
            format!("inflates to more than the {size} bytes its header declares"),
        )),
        TINFLStatus::FailedCannotMakeProgress | TINFLStatus::NeedsMoreInput => Err(
            DecodeError::truncated(FORMAT, "the deflate stream ends early"),
        ),
        _ => Err(DecodeError::corrupt(FORMAT, "invalid deflate data")),
    }
}

/// The CRC-32 of ZIP (IEEE 802.3), eight bytes at a time.
pub(crate) fn crc32(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    let mut chunks = data.chunks_exact(8);
    for chunk in &mut chunks {
        let low = u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]) ^ crc;
        let high = u32::from_le_bytes([chunk[4], chunk[5], chunk[6], chunk[7]]);
        crc = CRC_TABLES[7][(low & 0xFF) as usize]
            ^ CRC_TABLES[6][((low >> 8) & 0xFF) as usize]
            ^ CRC_TABLES[5][((low >> 16) & 0xFF) as usize]
            ^ CRC_TABLES[4][(low >> 24) as usize]
            ^ CRC_TABLES[3][(high & 0xFF) as usize]
            ^ CRC_TABLES[2][((high >> 8) & 0xFF) as usize]
            ^ CRC_TABLES[1][((high >> 16) & 0xFF) as usize]
            ^ CRC_TABLES[0][(high >> 24) as usize];
    }
    for &byte in chunks.remainder() {
        crc = (crc >> 8) ^ CRC_TABLES[0][((crc ^ u32::from(byte)) & 0xFF) as usize];
    }
    !crc
}

/// Slicing-by-8 tables: `[k][b]` is the CRC of byte `b` followed by `k` zeros.
const CRC_TABLES: [[u32; 256]; 8] = crc_tables();

const fn crc_tables() -> [[u32; 256]; 8] {
    let mut tables = [[0u32; 256]; 8];
    let mut byte = 0;
    while byte < 256 {
        let mut crc = byte as u32;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
            bit += 1;
        }
        tables[0][byte] = crc;
        byte += 1;
    }
    let mut byte = 0;
    while byte < 256 {
        let mut k = 1;
        while k < 8 {
            let previous = tables[k - 1][byte];
            tables[k][byte] = (previous >> 8) ^ tables[0][(previous & 0xFF) as usize];
            k += 1;
        }
        byte += 1;
    }
    tables
}

/// Code page 437 from 0x80 up: the names zipfile decodes without the UTF-8 flag.
const CP437_HIGH: [char; 128] = [
    'Ç', 'ü', 'é', 'â', 'ä', 'à', 'å', 'ç', 'ê', 'ë', 'è', 'ï', 'î', 'ì', 'Ä', 'Å', //
    'É', 'æ', 'Æ', 'ô', 'ö', 'ò', 'û', 'ù', 'ÿ', 'Ö', 'Ü', '¢', '£', '¥', '₧', 'ƒ', //
    'á', 'í', 'ó', 'ú', 'ñ', 'Ñ', 'ª', 'º', '¿', '⌐', '¬', '½', '¼', '¡', '«', '»', //
    '░', '▒', '▓', '│', '┤', '╡', '╢', '╖', '╕', '╣', '║', '╗', '╝', '╜', '╛', '┐', //
    '└', '┴', '┬', '├', '─', '┼', '╞', '╟', '╚', '╔', '╩', '╦', '╠', '═', '╬', '╧', //
    '╨', '╤', '╥', '╙', '╘', '╒', '╓', '╫', '╪', '┘', '┌', '█', '▄', '▌', '▐', '▀', //
    'α', 'ß', 'Γ', 'π', 'Σ', 'σ', 'µ', 'τ', 'Φ', 'Θ', 'Ω', 'δ', '∞', 'φ', 'ε', '∩', //
    '≡', '±', '≥', '≤', '⌠', '⌡', '÷', '≈', '°', '∙', '·', '√', 'ⁿ', '²', '■', '\u{a0}',
];

#[cfg(test)]
mod tests {
    use super::*;

    struct Member<'a> {
        name: &'a str,
        bytes: &'a [u8],
        deflate: bool,
    }

    fn member<'a>(name: &'a str, bytes: &'a [u8], deflate: bool) -> Member<'a> {
        Member {
            name,
            bytes,
            deflate,
        }
    }

    /// A ZIP archive as Python's zipfile writes numpy's members: ZIP64 extra
    /// fields in the local headers, plain sizes in the central directory.
    fn zip(members: &[Member]) -> Vec<u8> {
        let mut out = Vec::new();
        let mut directory = Vec::new();
        for member in members {
            let payload = if member.deflate {
                miniz_oxide::deflate::compress_to_vec(member.bytes, 6)
            } else {
                member.bytes.to_vec()
            };
            let method: u16 = if member.deflate { 8 } else { 0 };
            let crc = crc32(member.bytes);
            let offset = out.len() as u32;
            out.extend(LOCAL_HEADER_SIGNATURE);
            out.extend(45u16.to_le_bytes());
            out.extend(0u16.to_le_bytes());
            out.extend(method.to_le_bytes());
            out.extend([0; 4]);
            out.extend(crc.to_le_bytes());
            out.extend(u32::MAX.to_le_bytes());
            out.extend(u32::MAX.to_le_bytes());
            out.extend((member.name.len() as u16).to_le_bytes());
            out.extend(20u16.to_le_bytes());
            out.extend(member.name.as_bytes());
            out.extend(1u16.to_le_bytes());
            out.extend(16u16.to_le_bytes());
            out.extend((member.bytes.len() as u64).to_le_bytes());
            out.extend((payload.len() as u64).to_le_bytes());
            out.extend(&payload);

            directory.extend(CENTRAL_HEADER_SIGNATURE);
            directory.extend(45u16.to_le_bytes());
            directory.extend(45u16.to_le_bytes());
            directory.extend(0u16.to_le_bytes());
            directory.extend(method.to_le_bytes());
            directory.extend([0; 4]);
            directory.extend(crc.to_le_bytes());
            directory.extend((payload.len() as u32).to_le_bytes());
            directory.extend((member.bytes.len() as u32).to_le_bytes());
            directory.extend((member.name.len() as u16).to_le_bytes());
            directory.extend([0; 12]);
            directory.extend(offset.to_le_bytes());
            directory.extend(member.name.as_bytes());
        }
        let directory_offset = out.len() as u32;
        out.extend(&directory);
        out.extend(END_SIGNATURE);
        out.extend([0; 4]);
        out.extend((members.len() as u16).to_le_bytes());
        out.extend((members.len() as u16).to_le_bytes());
        out.extend((directory.len() as u32).to_le_bytes());
        out.extend(directory_offset.to_le_bytes());
        out.extend(0u16.to_le_bytes());
        out
    }

    /// A version 1.0 NPY file of little-endian int16s.
    fn npy_i16(values: &[i16]) -> Vec<u8> {
        let header = format!(
            "{{'descr': '<i2', 'fortran_order': False, 'shape': ({},), }}",
            values.len()
        );
        let mut text = header.into_bytes();
        text.resize(128 - 10 - 1, b' ');
        text.push(b'\n');
        let mut out = NPY_MAGIC.to_vec();
        out.extend([1, 0]);
        out.extend((text.len() as u16).to_le_bytes());
        out.extend(text);
        out.extend(values.iter().flat_map(|value| value.to_le_bytes()));
        out
    }

    fn parse(data: &[u8]) -> Result<Vec<NpzMember>, DecodeError> {
        parse_npz(data, &NpzOptions::default())
    }

    #[test]
    fn crc32_matches_the_standard_check_value() {
        assert_eq!(crc32(b""), 0);
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
        assert_eq!(
            crc32(b"The quick brown fox jumps over the lazy dog"),
            0x414F_A339
        );
    }

    #[test]
    fn reads_stored_and_deflated_members() {
        let a = npy_i16(&[1, 2, 3]);
        let b = npy_i16(&[7; 500]);
        let archive = zip(&[member("a.npy", &a, false), member("b.npy", &b, true)]);
        let members = parse(&archive).unwrap();
        assert_eq!(members.len(), 2);
        assert_eq!(
            (members[0].key.as_str(), members[1].key.as_str()),
            ("a", "b")
        );
        assert_eq!(members[0].bytes(&archive), &a[..]);
        assert!(matches!(members[0].data, MemberData::Stored { .. }));
        assert_eq!(members[1].bytes(&archive), &b[..]);
        assert!(matches!(members[1].data, MemberData::Inflated(_)));
        assert_eq!(members[1].array.as_ref().unwrap().shape, vec![500]);
    }

    #[test]
    fn other_members_come_back_as_bytes() {
        let archive = zip(&[member("notes.txt", b"hello", true)]);
        let members = parse(&archive).unwrap();
        assert_eq!(members[0].key, "notes.txt");
        assert_eq!(members[0].bytes(&archive), b"hello");
        assert!(members[0].array.is_none());
    }

    #[test]
    fn keys_follow_numpy() {
        let one = npy_i16(&[1]);
        let two = npy_i16(&[2, 2]);
        let three = npy_i16(&[3, 3, 3]);
        // A repeated name opens its last member; an exact name beats a
        // stripped one, whatever the order.
        let archive = zip(&[
            member("x.npy", &one, false),
            member("x.npy", &two, false),
            member("y.npy", &one, false),
            member("y", &three, false),
        ]);
        let members = parse(&archive).unwrap();
        let found: Vec<(&str, &str, usize)> = members
            .iter()
            .map(|m| {
                (
                    m.key.as_str(),
                    m.name.as_str(),
                    m.array.as_ref().unwrap().count(),
                )
            })
            .collect();
        assert_eq!(found, vec![("x", "x.npy", 2), ("y", "y", 3)]);
    }

    #[test]
    fn an_empty_archive_is_empty() {
        assert_eq!(parse(&zip(&[])).unwrap(), vec![]);
    }

    #[test]
    fn caps_the_inflated_bytes() {
        let big = npy_i16(&[0; 4000]);
        let archive = zip(&[member("a.npy", &big, true), member("b.npy", &big, true)]);
        let options = NpzOptions {
            max_bytes: big.len() as u64 + 10,
            check_crc: true,
        };
        assert!(matches!(
            parse_npz(&archive, &options),
            Err(DecodeError::TooManyBytes { bytes, .. }) if bytes == 2 * big.len() as u64
        ));
        // Stored members are not inflated, so they do not count.
        let archive = zip(&[member("a.npy", &big, false), member("b.npy", &big, false)]);
        assert!(parse_npz(&archive, &options).is_ok());
    }

    #[test]
    fn refuses_sizes_deflate_cannot_produce() {
        let mut archive = zip(&[member("a.npy", &npy_i16(&[0; 100]), true)]);
        // The central directory's uncompressed size: 2**32 - 2 bytes.
        let directory = find_end_record(&archive).unwrap() - (CENTRAL_HEADER_SIZE + 5);
        archive[directory + 24..directory + 28].copy_from_slice(&0xFFFF_FFFEu32.to_le_bytes());
        let result = parse(&archive);
        assert!(
            matches!(result, Err(DecodeError::Corrupt { .. })),
            "{result:?}"
        );
    }

    #[test]
    fn checks_crcs() {
        let a = npy_i16(&[1, 2, 3]);
        for deflate in [false, true] {
            let mut archive = zip(&[member("a.npy", &a, deflate)]);
            let directory = find_end_record(&archive).unwrap() - (CENTRAL_HEADER_SIZE + 5);
            archive[directory + 16] ^= 1;
            let result = parse(&archive);
            assert!(
                matches!(result, Err(DecodeError::Corrupt { .. })),
                "{result:?}"
            );
            let options = NpzOptions {
                check_crc: false,
                ..NpzOptions::default()
            };
            assert!(parse_npz(&archive, &options).is_ok());
        }
    }

    #[test]
    fn refuses_object_members() {
        let mut object = npy_i16(&[0, 0]);
        let at = object.windows(3).position(|w| w == b"<i2").unwrap();
        object[at..at + 3].copy_from_slice(b"|O8");
        let archive = zip(&[member("a.npy", &object, false)]);
        assert_eq!(parse(&archive), Err(DecodeError::ObjectDtype));
    }

    #[test]
    fn names_the_member_of_an_npy_error() {
        let a = npy_i16(&[1, 2, 3]);
        let archive = zip(&[member("a.npy", &a[..a.len() - 1], false)]);
        let message = parse(&archive).unwrap_err().to_string();
        assert!(
            message.starts_with("NPZ: truncated data: member 'a.npy'"),
            "{message}"
        );
    }

    #[test]
    fn every_truncation_and_bit_flip_is_handled() {
        let a = npy_i16(&[1, 2, 3]);
        let b = npy_i16(&[9; 40]);
        for archive in [
            zip(&[member("a.npy", &a, false), member("b.npy", &b, true)]),
            zip(&[member("a.npy", &a, true)]),
        ] {
            assert!(parse(&archive).is_ok());
            for cut in 0..archive.len() {
                assert!(parse(&archive[..cut]).is_err(), "cut at {cut}");
            }
            for at in 0..archive.len() {
                for bit in [0x01, 0x80] {
                    let mut flipped = archive.clone();
                    flipped[at] ^= bit;
                    // Either an error or members: never a panic.
                    let _ = parse(&flipped);
                }
            }
        }
    }

    #[test]
    fn refuses_what_is_not_a_zip_archive() {
        for data in [
            &b""[..],
            b"P",
            b"PK\x03",
            b"\x93NUMPY\x01\x00",
            b"PK\x03\x04junk",
        ] {
            let result = parse(data);
            assert!(
                matches!(
                    result,
                    Err(DecodeError::Truncated { .. } | DecodeError::Corrupt { .. })
                ),
                "{data:?}: {result:?}"
            );
        }
    }

    #[test]
    fn decodes_cp437_names() {
        let archive = zip(&[member("\u{e9}.bin", b"x", false)]);
        // The writer stores the name as UTF-8 without the flag, as old tools did.
        let members = parse(&archive).unwrap();
        assert_eq!(members[0].key, "\u{251c}\u{2310}.bin");
    }
}
