//! Video frames through FFmpeg (the `video` cargo feature, on the system's
//! libavformat, libavcodec and libswscale): a run of frames picked by index,
//! converted to RGB (and optionally resized) by swscale straight into one
//! `frames * height * width * 3` buffer.
//!
//! Bytes are read by FFmpeg through a custom AVIOContext over the slice, so a
//! video in memory is never copied to a file; a path is opened by FFmpeg's
//! own `file:` protocol, so it is read as it is decoded, never whole.

use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::path::Path;
use std::ptr;
use std::sync::Once;

use ffmpeg_next as ffmpeg;
use ffmpeg_next::ffi;
use ffmpeg_next::format::context::Input;
use ffmpeg_next::{codec, media, Packet};

use super::DecodeError;

const FORMAT: &str = "video";

/// The default cap on decoded pixels, over all frames: 2**30, 3 GiB of RGB
/// (128 frames of 4K, 500 of 1080p), far above a training clip yet below
/// what a forged header could make a loader allocate.
pub const DEFAULT_MAX_VIDEO_PIXELS: u64 = 1 << 30;

/// FFmpeg's own default I/O buffer size.
const IO_BUFFER_SIZE: usize = 32 * 1024;

/// Where the encoded video is.
#[derive(Debug, Clone, Copy)]
pub enum VideoSource<'a> {
    /// A whole file in memory.
    Bytes(&'a [u8]),
    /// A regular local file, read by FFmpeg as it decodes (never a URL).
    Path(&'a Path),
}

/// Which frames to decode, and to what size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VideoOptions {
    /// Index of the first frame, in presentation order.
    pub start: usize,
    /// How many frames to return; at least 1.
    pub num_frames: usize,
    /// Take every `stride`-th frame from `start`; at least 1.
    pub stride: usize,
    /// Resize every frame to (height, width); None keeps the video's size.
    pub size: Option<(usize, usize)>,
    /// Largest output, in pixels over all frames, checked before allocating.
    pub max_pixels: u64,
}

impl VideoOptions {
    /// `num_frames` frames from the first, at the video's own size.
    pub fn new(num_frames: usize) -> Self {
        VideoOptions {
            start: 0,
            num_frames,
            stride: 1,
            size: None,
            max_pixels: DEFAULT_MAX_VIDEO_PIXELS,
        }
    }

    /// Index of the last frame wanted.
    fn last_index(&self) -> usize {
        self.start
            .saturating_add((self.num_frames - 1).saturating_mul(self.stride))
    }

    fn validate(&self) -> Result<(), DecodeError> {
        let invalid = |reason: String| Err(DecodeError::InvalidArgument(reason));
        if self.num_frames == 0 {
            return invalid("decode_video: num_frames must be at least 1".to_owned());
        }
        if self.stride == 0 {
            return invalid("decode_video: stride must be at least 1".to_owned());
        }
        if let Some((height, width)) = self.size {
            if height == 0 || width == 0 || height > i32::MAX as usize || width > i32::MAX as usize
            {
                return invalid(format!(
                    "decode_video: size must be two positive ints (height, width), not ({height}, {width})"
                ));
            }
        }
        Ok(())
    }
}

/// Decoded frames: `frames * height * width * 3` bytes, RGB, frame-major,
/// rows top to bottom, channels interleaved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodedVideo {
    pub frames: usize,
    pub height: usize,
    pub width: usize,
    pub data: Vec<u8>,
}

/// Decodes `options.num_frames` frames, from index `options.start` every
/// `options.stride`-th, to RGB.
///
/// Frames are counted in the order the decoder outputs them, which is
/// presentation order. Every frame up to the last one wanted is decoded (the
/// codecs need the frames before); only the wanted ones are converted. The
/// output's size is `options.size`, or else the first frame's: a stream that
/// changes resolution midway has its later frames scaled to it.
///
/// Errors: a video with fewer frames than wanted raises
/// [`DecodeError::Truncated`] when the container declares (or its duration
/// implies) more frames than could be decoded, [`DecodeError::TooFewFrames`] naming the frame count
/// otherwise; a decoding error in any frame up to the last wanted one fails
/// the whole call rather than shifting the indices.
pub fn decode_video(
    source: VideoSource<'_>,
    options: &VideoOptions,
) -> Result<DecodedVideo, DecodeError> {
    options.validate()?;
    init_ffmpeg();
    let _capture = LogCapture::start();
    let mut opened = OpenedInput::open(source, options.max_pixels)?;
    let mut video = VideoStream::find(&mut opened, options.max_pixels)?;
    video.decode(&mut opened.input, options)
}

/// Initialises FFmpeg once: its error strings, and a log callback that turns
/// the messages of minato's own decoding into error reasons.
fn init_ffmpeg() {
    static INIT: Once = Once::new();
    INIT.call_once(|| {
        // Cannot fail on FFmpeg 5 and later (it only registers the error
        // strings there); were it to, errors would merely read less well.
        let _ = ffmpeg::init();
        install_log_callback();
    });
}

// ---------------------------------------------------------------------------
// FFmpeg's log: captured on threads that are decoding for minato, so that an
// error can say why ("moov atom not found") instead of only FFmpeg's generic
// code ("Invalid data found when processing input"), and so that a corrupt
// file does not also spray stderr. Other threads (another library using the
// same FFmpeg in this process) keep FFmpeg's default logging.

thread_local! {
    /// Some while this thread decodes: the first error logged since the last
    /// [`take_logged_error`].
    static LOGGED_ERROR: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Marks this thread as decoding for the guard's lifetime.
struct LogCapture;

impl LogCapture {
    fn start() -> Self {
        LOGGED_ERROR.with(|logged| *logged.borrow_mut() = Some(String::new()));
        LogCapture
    }
}

impl Drop for LogCapture {
    fn drop(&mut self) {
        LOGGED_ERROR.with(|logged| *logged.borrow_mut() = None);
    }
}

/// The first error FFmpeg logged on this thread since the last call, if any.
fn take_logged_error() -> Option<String> {
    LOGGED_ERROR.with(|logged| {
        let mut logged = logged.borrow_mut();
        let message = std::mem::take(logged.as_mut()?);
        (!message.is_empty()).then_some(message)
    })
}

#[cfg(all(target_arch = "x86_64", target_family = "unix"))]
fn install_log_callback() {
    // SAFETY: `capture_log` has the signature FFmpeg calls its log callback
    // with, never unwinds, and is a plain function, valid for the process.
    unsafe { ffi::av_log_set_callback(Some(capture_log)) };
}

/// Elsewhere the va_list type differs; FFmpeg's generic error strings are
/// the reasons there.
#[cfg(not(all(target_arch = "x86_64", target_family = "unix")))]
fn install_log_callback() {}

#[cfg(all(target_arch = "x86_64", target_family = "unix"))]
unsafe extern "C" fn capture_log(
    class: *mut c_void,
    level: c_int,
    format: *const c_char,
    arguments: *mut ffi::__va_list_tag,
) {
    // try_with: FFmpeg may log from a thread whose thread-locals are being
    // torn down; that thread is not decoding for minato.
    let capturing = LOGGED_ERROR
        .try_with(|logged| logged.try_borrow().map(|l| l.is_some()).unwrap_or(false))
        .unwrap_or(false);
    if !capturing {
        // SAFETY: the arguments are FFmpeg's own, passed on unchanged and
        // once, to the callback FFmpeg would have called itself.
        unsafe { ffi::av_log_default_callback(class, level, format, arguments) };
        return;
    }
    // The bits above the level are colour hints (AV_LOG_C).
    if level & 0xff > ffi::AV_LOG_ERROR {
        return;
    }
    let mut line = [0 as c_char; 512];
    // The "[h264 @ 0x...] " prefix names the component that failed.
    let mut print_prefix: c_int = 1;
    // SAFETY: `format` and `arguments` are FFmpeg's, consumed once here;
    // `line` is writable for its stated length and FFmpeg NUL-terminates it.
    let written = unsafe {
        ffi::av_log_format_line2(
            class,
            level,
            format,
            arguments,
            line.as_mut_ptr(),
            line.len() as c_int,
            &mut print_prefix,
        )
    };
    if written < 0 {
        return;
    }
    // SAFETY: av_log_format_line2 always NUL-terminates within `line`.
    let message = unsafe { CStr::from_ptr(line.as_ptr()) }.to_string_lossy();
    // "[NULL]" is the prefix of a component without a name.
    let message = without_addresses(message.trim());
    let message = message.strip_prefix("[NULL] ").unwrap_or(&message);
    let _ = LOGGED_ERROR.try_with(|logged| {
        if let Ok(mut logged) = logged.try_borrow_mut() {
            if let Some(first) = logged.as_mut().filter(|first| first.is_empty()) {
                first.push_str(message);
            }
        }
    });
}

/// `line` without the " @ 0x55d0c3f0a100" addresses in its prefixes, which
/// mean nothing to the caller: "[h264] error while decoding MB 3 2".
fn without_addresses(line: &str) -> String {
    let mut rest = line;
    let mut cleaned = String::with_capacity(line.len());
    while let Some(at) = rest.find(" @ 0x") {
        let Some(close) = rest[at..].find(']') else {
            break;
        };
        cleaned.push_str(&rest[..at]);
        rest = &rest[at + close..];
    }
    cleaned.push_str(rest);
    cleaned
}

/// The reason for an FFmpeg failure: its error, and what it logged.
fn reason(what: &str, error: ffmpeg::Error) -> String {
    match take_logged_error() {
        Some(logged) => format!("{what}: {error} ({logged})"),
        None => format!("{what}: {error}"),
    }
}

/// Classifies an FFmpeg failure: the data ended, FFmpeg cannot decode it, or
/// it is broken.
fn failure(what: &str, error: ffmpeg::Error) -> DecodeError {
    use ffmpeg::Error as E;
    let reason = reason(what, error);
    match error {
        E::Eof => DecodeError::truncated(FORMAT, reason),
        E::DecoderNotFound
        | E::DemuxerNotFound
        | E::PatchWelcome
        | E::Experimental
        | E::StreamNotFound
        | E::ProtocolNotFound => DecodeError::unsupported(FORMAT, reason),
        _ => DecodeError::corrupt(FORMAT, reason),
    }
}

// ---------------------------------------------------------------------------
// Opening: a demuxer over memory or over a local file.

/// The opened container and, for bytes, the I/O it reads through. Fields
/// drop in order: the demuxer before the I/O it reads from.
struct OpenedInput<'a> {
    input: Input,
    /// Each stream's frame size in pixels as the header declares it (0 when
    /// it does not): a stream whose decoders refused its frames for the cap
    /// comes out of avformat_find_stream_info with its size reset to 0.
    header_pixels: Vec<u64>,
    _memory: Option<MemoryIo<'a>>,
}

impl<'a> OpenedInput<'a> {
    /// Opens the container and reads its streams' parameters, which decodes
    /// a few frames with no frame above `max_pixels`.
    fn open(source: VideoSource<'a>, max_pixels: u64) -> Result<Self, DecodeError> {
        let (context, memory) = match source {
            VideoSource::Bytes(bytes) => {
                let memory = MemoryIo::new(bytes)?;
                (open_memory(&memory)?, Some(memory))
            }
            VideoSource::Path(path) => (open_path(path)?, None),
        };
        // SAFETY: `context` was just opened by avformat_open_input and is
        // owned by nothing else; Input closes it (avformat_close_input) on
        // drop, which leaves a custom AVIOContext to `memory`, dropped after.
        let mut input = unsafe { Input::wrap(context) };
        let header_pixels = (0..input.nb_streams() as usize)
            .map(|index| frame_pixels(&input, index))
            .collect();
        let mut stream_options = Vec::new();
        for _ in 0..input.nb_streams() {
            let mut options = Dictionary::new();
            options.set(c"max_pixels", &decoder_max_pixels(max_pixels))?;
            stream_options.push(options);
        }
        // SAFETY: `input` holds an opened context; the options array holds
        // one dictionary per stream (Dictionary is a transparent pointer),
        // which FFmpeg may replace and which are freed on drop.
        let status = unsafe {
            ffi::avformat_find_stream_info(
                input.as_mut_ptr(),
                stream_options.as_mut_ptr() as *mut *mut ffi::AVDictionary,
            )
        };
        if status < 0 {
            return Err(failure(
                &format!("{}: reading the stream parameters", input.format().name()),
                ffmpeg::Error::from(status),
            ));
        }
        Ok(OpenedInput {
            input,
            header_pixels,
            _memory: memory,
        })
    }
}

/// Pixels per frame of stream `index` as its codec parameters say (0 when
/// they do not).
fn frame_pixels(input: &Input, index: usize) -> u64 {
    // SAFETY: `index` is below nb_streams of an opened context, whose
    // streams all have codec parameters.
    let (width, height) = unsafe {
        let context = input.as_ptr();
        let parameters = (**(*context).streams.add(index)).codecpar;
        ((*parameters).width, (*parameters).height)
    };
    u64::try_from(width).unwrap_or(0) * u64::try_from(height).unwrap_or(0)
}

/// Opens `path` with FFmpeg's `file:` protocol, and only that, so that
/// neither the path ("http://...", "concat:...") nor a playlist inside the
/// file can make FFmpeg fetch a URL; a playlist may name other local files,
/// as it may for the ffmpeg command.
fn open_path(path: &Path) -> Result<*mut ffi::AVFormatContext, DecodeError> {
    // The errors open() would give, with the path, before FFmpeg's own.
    let io_error = |err: std::io::Error| DecodeError::Io {
        path: path.display().to_string(),
        kind: err.kind(),
        message: err.to_string(),
    };
    let metadata = std::fs::metadata(path).map_err(io_error)?;
    if metadata.is_dir() {
        let is_a_directory = ffmpeg::util::error::EISDIR;
        return Err(io_error(std::io::Error::from_raw_os_error(is_a_directory)));
    }
    // A FIFO or a device could block or never end.
    if !metadata.is_file() {
        return Err(io_error(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "decode_video reads regular files only",
        )));
    }
    let url = file_url(path)?;
    let mut options = Dictionary::new();
    options.set(c"protocol_whitelist", c"file")?;
    let mut context = ptr::null_mut();
    // SAFETY: `context` is null, so FFmpeg allocates the context; `url` and
    // `options` outlive the call; FFmpeg frees the context on failure.
    let status = unsafe {
        ffi::avformat_open_input(
            &mut context,
            url.as_ptr(),
            ptr::null(),
            options.as_mut_ptr(),
        )
    };
    if status < 0 {
        // The file vanishing or locked since the check above is an OSError;
        // other errno values (EINVAL, ENOMEM) come from the data.
        use ffmpeg::util::error::{EACCES, ENOENT, EPERM};
        return Err(match ffmpeg::Error::from(status) {
            ffmpeg::Error::Other { errno } if [ENOENT, EACCES, EPERM].contains(&errno) => {
                io_error(std::io::Error::from_raw_os_error(errno))
            }
            error => open_failure(error),
        });
    }
    Ok(context)
}

/// `file:` and the path's bytes, as FFmpeg's file protocol takes them.
fn file_url(path: &Path) -> Result<CString, DecodeError> {
    #[cfg(unix)]
    let path_bytes = std::os::unix::ffi::OsStrExt::as_bytes(path.as_os_str()).to_vec();
    #[cfg(not(unix))]
    let path_bytes = path.to_string_lossy().into_owned().into_bytes();
    let mut url = b"file:".to_vec();
    url.extend_from_slice(&path_bytes);
    CString::new(url).map_err(|_| {
        DecodeError::InvalidArgument(format!(
            "decode_video: the path contains a NUL byte: {}",
            path.display()
        ))
    })
}

/// Opens the demuxer over `memory`.
fn open_memory(memory: &MemoryIo<'_>) -> Result<*mut ffi::AVFormatContext, DecodeError> {
    // A demuxer that opens other resources (HLS, concat) must not reach
    // files or the network from bytes a caller handed over.
    let mut options = Dictionary::new();
    options.set(c"protocol_whitelist", c"none")?;
    // SAFETY: plain allocation; checked for null below.
    let mut context = unsafe { ffi::avformat_alloc_context() };
    if context.is_null() {
        return Err(DecodeError::corrupt(FORMAT, "out of memory"));
    }
    // SAFETY: `context` is a fresh, valid context. With
    // AVFMT_FLAG_CUSTOM_IO, FFmpeg reads through `memory.context` and never
    // frees it; `memory` outlives the demuxer (see OpenedInput). On failure
    // avformat_open_input frees `context`; the URL and options outlive the
    // call.
    let status = unsafe {
        (*context).pb = memory.context;
        (*context).flags |= ffi::AVFMT_FLAG_CUSTOM_IO;
        ffi::avformat_open_input(
            &mut context,
            c"".as_ptr(),
            ptr::null(),
            options.as_mut_ptr(),
        )
    };
    if status < 0 {
        return Err(open_failure(ffmpeg::Error::from(status)));
    }
    Ok(context)
}

/// An open that failed: a container FFmpeg recognised but could not read
/// logs why; with nothing logged, no demuxer recognised the data.
fn open_failure(error: ffmpeg::Error) -> DecodeError {
    match (error, take_logged_error()) {
        (ffmpeg::Error::InvalidData, None) => DecodeError::unsupported(
            FORMAT,
            format!("FFmpeg recognises no container in the data ({error})"),
        ),
        (error, Some(logged)) => {
            let reason = format!("opening the container: {error} ({logged})");
            match error {
                ffmpeg::Error::Eof => DecodeError::truncated(FORMAT, reason),
                _ => DecodeError::corrupt(FORMAT, reason),
            }
        }
        (error, None) => failure("opening the container", error),
    }
}

/// FFmpeg decoders' own `max_pixels` option (pixels per frame, at most
/// INT_MAX): they refuse larger frames before allocating them.
fn decoder_max_pixels(max_pixels: u64) -> CString {
    let capped = max_pixels.min(i32::MAX as u64);
    CString::new(capped.to_string()).expect("digits contain no NUL")
}

/// An AVDictionary of options, freed on drop.
#[repr(transparent)]
struct Dictionary(*mut ffi::AVDictionary);

impl Dictionary {
    fn new() -> Self {
        Dictionary(ptr::null_mut())
    }

    /// Sets an option; fails only when out of memory, which must not leave
    /// a protective option unset.
    fn set(&mut self, key: &CStr, value: &CStr) -> Result<(), DecodeError> {
        // SAFETY: `self.0` is null or a dictionary FFmpeg allocated; FFmpeg
        // copies the key and value.
        let status = unsafe { ffi::av_dict_set(&mut self.0, key.as_ptr(), value.as_ptr(), 0) };
        if status < 0 {
            return Err(DecodeError::corrupt(FORMAT, "out of memory"));
        }
        Ok(())
    }

    fn as_mut_ptr(&mut self) -> *mut *mut ffi::AVDictionary {
        &mut self.0
    }
}

impl Drop for Dictionary {
    fn drop(&mut self) {
        // SAFETY: null or a dictionary FFmpeg allocated (and may have
        // replaced with the options it did not consume); freed once.
        unsafe { ffi::av_dict_free(&mut self.0) };
    }
}

/// An AVIOContext reading from a byte slice.
struct MemoryIo<'a> {
    context: *mut ffi::AVIOContext,
    /// Owned (Box::into_raw) and freed in drop: FFmpeg holds it as `opaque`.
    reader: *mut MemoryReader<'a>,
}

struct MemoryReader<'a> {
    data: &'a [u8],
    position: usize,
}

impl<'a> MemoryIo<'a> {
    fn new(data: &'a [u8]) -> Result<Self, DecodeError> {
        let reader = Box::into_raw(Box::new(MemoryReader { data, position: 0 }));
        // SAFETY: plain allocation; checked for null below.
        let buffer = unsafe { ffi::av_malloc(IO_BUFFER_SIZE) } as *mut u8;
        if buffer.is_null() {
            // SAFETY: `reader` came from Box::into_raw just above.
            drop(unsafe { Box::from_raw(reader) });
            return Err(DecodeError::corrupt(FORMAT, "out of memory"));
        }
        // SAFETY: `buffer` is an av_malloc'ed block of IO_BUFFER_SIZE bytes,
        // now owned by the context; `reader` stays valid until drop, after
        // every use of the context; the callbacks match FFmpeg's signatures.
        let context = unsafe {
            ffi::avio_alloc_context(
                buffer,
                IO_BUFFER_SIZE as c_int,
                0,
                reader as *mut c_void,
                Some(read_memory),
                None,
                Some(seek_memory),
            )
        };
        if context.is_null() {
            // SAFETY: the context was not created, so `buffer` and `reader`
            // are still ours alone.
            unsafe {
                ffi::av_free(buffer as *mut c_void);
                drop(Box::from_raw(reader));
            }
            return Err(DecodeError::corrupt(FORMAT, "out of memory"));
        }
        Ok(MemoryIo { context, reader })
    }
}

impl Drop for MemoryIo<'_> {
    fn drop(&mut self) {
        // SAFETY: the demuxer using the context is closed (OpenedInput drops
        // it first, and a failed open closes it itself). The buffer is the
        // context's current one, which FFmpeg may have reallocated, so it is
        // freed through the context; then the context, then the reader,
        // each once.
        unsafe {
            ffi::av_freep(ptr::addr_of_mut!((*self.context).buffer) as *mut c_void);
            ffi::avio_context_free(&mut self.context);
            drop(Box::from_raw(self.reader));
        }
    }
}

/// AVIOContext's read callback: copies the next bytes of the slice.
unsafe extern "C" fn read_memory(opaque: *mut c_void, buffer: *mut u8, size: c_int) -> c_int {
    // SAFETY: `opaque` is the MemoryReader given to avio_alloc_context,
    // alive while the context is, and only FFmpeg's calls on this thread
    // touch it.
    let reader = unsafe { &mut *(opaque as *mut MemoryReader<'_>) };
    let remaining = reader.data.get(reader.position..).unwrap_or_default();
    let count = remaining.len().min(size.max(0) as usize);
    if count == 0 {
        return ffi::AVERROR_EOF;
    }
    // SAFETY: FFmpeg's buffer is writable for `size` bytes, `count` is at
    // most that and at most what is left of the slice; they cannot overlap.
    unsafe { ptr::copy_nonoverlapping(remaining.as_ptr(), buffer, count) };
    reader.position += count;
    count as c_int
}

/// AVIOContext's seek callback, with AVSEEK_SIZE for the slice's length.
unsafe extern "C" fn seek_memory(opaque: *mut c_void, offset: i64, whence: c_int) -> i64 {
    // SAFETY: as in read_memory.
    let reader = unsafe { &mut *(opaque as *mut MemoryReader<'_>) };
    let length = reader.data.len() as i64;
    let whence = whence & !ffi::AVSEEK_FORCE;
    let base = match whence {
        ffi::AVSEEK_SIZE => return length,
        ffi::SEEK_SET => 0,
        ffi::SEEK_CUR => reader.position as i64,
        ffi::SEEK_END => length,
        _ => return i64::from(ffi::AVERROR(ffmpeg::util::error::EINVAL)),
    };
    match base.checked_add(offset) {
        Some(target) if (0..=length).contains(&target) => {
            reader.position = target as usize;
            target
        }
        _ => i64::from(ffi::AVERROR(ffmpeg::util::error::EINVAL)),
    }
}

// ---------------------------------------------------------------------------
// Decoding.

/// The video stream picked in a container, with its opened decoder.
struct VideoStream {
    index: usize,
    decoder: codec::decoder::Video,
    /// The frame count the container declares, or its duration implies.
    expected_frames: Option<ExpectedFrames>,
    /// "h264 in mov,mp4,m4a,3gp,3g2,mj2", for errors.
    description: String,
}

impl VideoStream {
    /// Picks the best video stream and opens its decoder, which refuses
    /// frames above `max_pixels`.
    fn find(opened: &mut OpenedInput<'_>, max_pixels: u64) -> Result<Self, DecodeError> {
        let input = &mut opened.input;
        let container = input.format().name().to_owned();
        let Some(stream) = input.streams().best(media::Type::Video) else {
            let kinds: Vec<String> = input
                .streams()
                .map(|stream| format!("{:?}", stream.parameters().medium()).to_lowercase())
                .collect();
            return Err(DecodeError::unsupported(
                FORMAT,
                format!(
                    "{container}: no video stream (streams: {})",
                    if kinds.is_empty() {
                        "none".to_owned()
                    } else {
                        kinds.join(", ")
                    }
                ),
            ));
        };
        let index = stream.index();
        let expected_frames = ExpectedFrames::of(&stream, input.duration());
        let codec_name = stream.parameters().id().name();
        let description = format!("{codec_name} in {container}");
        // A frame the header declares beyond the cap fails before decoding
        // (and before the decoder refuses it, less clearly).
        let header_pixels = opened.header_pixels.get(index).copied().unwrap_or(0);
        let declared_pixels = header_pixels.max(frame_pixels(input, index));
        DecodeError::check_size(FORMAT, declared_pixels, max_pixels)?;
        let decoder = codec::context::Context::from_parameters(stream.parameters())
            .and_then(|mut context| {
                // SAFETY: a valid, not yet opened codec context.
                unsafe {
                    (*context.as_mut_ptr()).max_pixels = max_pixels.min(i32::MAX as u64) as i64
                };
                context.decoder().video()
            })
            .map_err(|error| match error {
                ffmpeg::Error::DecoderNotFound => DecodeError::unsupported(
                    FORMAT,
                    reason(
                        &format!("{description}: this FFmpeg has no decoder for it"),
                        error,
                    ),
                ),
                error => failure(&format!("{description}: opening the decoder"), error),
            })?;
        // The demuxer can skip every other stream's packets unread.
        // SAFETY: `input` is an opened context; its `streams` array holds
        // `nb_streams` valid stream pointers.
        unsafe {
            let context = input.as_mut_ptr();
            for i in 0..(*context).nb_streams as usize {
                if i != index {
                    (**(*context).streams.add(i)).discard = ffi::AVDiscard::AVDISCARD_ALL;
                }
            }
        }
        Ok(VideoStream {
            index,
            decoder,
            expected_frames,
            description,
        })
    }

    fn decode(
        &mut self,
        input: &mut Input,
        options: &VideoOptions,
    ) -> Result<DecodedVideo, DecodeError> {
        // The whole output, at the size the header declares, checked before
        // decoding; Output::allocate checks again at the decoded size.
        let declared_pixels = u64::from(self.decoder.width()) * u64::from(self.decoder.height());
        if options.size.is_none() && declared_pixels > 0 {
            let total = declared_pixels.saturating_mul(options.num_frames as u64);
            DecodeError::check_size(FORMAT, total, options.max_pixels)?;
        }

        let mut collector = FrameCollector::new(options);
        let mut frame = ffmpeg::frame::Video::empty();
        let mut at_end = false;
        while !collector.is_done() && !at_end {
            take_logged_error();
            // A fresh packet each time: Packet's drop unreferences it.
            let mut packet = Packet::empty();
            match packet.read(input) {
                Ok(()) if packet.stream() != self.index => continue,
                Ok(()) => self.decoder.send_packet(&packet).map_err(|error| {
                    // The demuxer flags a packet it could not read whole.
                    let cut_short = if packet.is_corrupt() {
                        " (a packet cut short)"
                    } else {
                        ""
                    };
                    let what = format!(
                        "{}: decoding failed after {} frames{cut_short}",
                        self.description, collector.decoded
                    );
                    match failure(&what, error) {
                        DecodeError::Corrupt { format, reason } if packet.is_corrupt() => {
                            DecodeError::Truncated { format, reason }
                        }
                        other => other,
                    }
                })?,
                Err(ffmpeg::Error::Eof) => {
                    // Drains the frames the decoder still holds back.
                    at_end = true;
                    self.decoder.send_eof().map_err(|error| {
                        failure(
                            &format!("{}: flushing the decoder", self.description),
                            error,
                        )
                    })?;
                }
                Err(error) => {
                    return Err(failure(
                        &format!(
                            "{}: reading failed after {} frames",
                            self.description, collector.decoded
                        ),
                        error,
                    ))
                }
            }
            while !collector.is_done() {
                match self.decoder.receive_frame(&mut frame) {
                    Ok(()) => collector.add(&frame, &self.description)?,
                    Err(ffmpeg::Error::Eof) => break,
                    Err(ffmpeg::Error::Other { errno }) if errno == ffmpeg::util::error::EAGAIN => {
                        break
                    }
                    Err(error) => {
                        return Err(failure(
                            &format!(
                                "{}: decoding failed after {} frames",
                                self.description, collector.decoded
                            ),
                            error,
                        ))
                    }
                }
            }
        }
        if collector.is_done() {
            return Ok(collector.finish());
        }
        let decoded = collector.decoded;
        if decoded == 0 {
            return Err(DecodeError::corrupt(
                FORMAT,
                format!("{}: no frame could be decoded", self.description),
            ));
        }
        match self.expected_frames {
            Some(ExpectedFrames::Declared(frames)) if frames > decoded as u64 => {
                return Err(DecodeError::truncated(
                    FORMAT,
                    format!(
                        "{}: the container declares {frames} frames, but the data ends after {decoded}",
                        self.description
                    ),
                ));
            }
            // One frame of slack for the rounding of durations.
            Some(ExpectedFrames::FromDuration(frames)) if frames > decoded as u64 + 1 => {
                return Err(DecodeError::truncated(
                    FORMAT,
                    format!(
                        "{}: the container's duration implies about {frames} frames, but the data ends after {decoded}",
                        self.description
                    ),
                ));
            }
            _ => {}
        }
        Err(DecodeError::TooFewFrames {
            frames: decoded,
            last_index: options.last_index(),
        })
    }
}

/// How many frames a stream should have, to tell a truncated file from a
/// short video.
#[derive(Debug, Clone, Copy)]
enum ExpectedFrames {
    /// The container's frame count (MP4, AVI).
    Declared(u64),
    /// Duration times the average frame rate (Matroska, WebM): an estimate.
    FromDuration(u64),
}

impl ExpectedFrames {
    /// `container_duration` is in AV_TIME_BASE units, for a stream that
    /// states no duration of its own.
    fn of(stream: &ffmpeg::format::stream::Stream<'_>, container_duration: i64) -> Option<Self> {
        if stream.frames() > 0 {
            return Some(ExpectedFrames::Declared(stream.frames() as u64));
        }
        let rate = stream.avg_frame_rate();
        let seconds = if stream.duration() > 0 {
            stream.duration() as f64 * f64::from(stream.time_base())
        } else if container_duration > 0 {
            container_duration as f64 / f64::from(ffi::AV_TIME_BASE)
        } else {
            return None;
        };
        if rate.numerator() <= 0 || rate.denominator() <= 0 {
            return None;
        }
        let frames = (seconds * f64::from(rate)).round();
        (frames.is_finite() && frames >= 1.0).then_some(ExpectedFrames::FromDuration(frames as u64))
    }
}

/// Counts decoded frames and converts the wanted ones into the output.
struct FrameCollector {
    options: VideoOptions,
    /// Frames decoded so far: the index of the next one.
    decoded: usize,
    /// Frames written to the output.
    collected: usize,
    output: Option<Output>,
    scaler: Option<Scaler>,
}

struct Output {
    height: usize,
    width: usize,
    data: Vec<u8>,
}

impl FrameCollector {
    fn new(options: &VideoOptions) -> Self {
        FrameCollector {
            options: *options,
            decoded: 0,
            collected: 0,
            output: None,
            scaler: None,
        }
    }

    fn is_done(&self) -> bool {
        self.collected == self.options.num_frames
    }

    fn add(&mut self, frame: &ffmpeg::frame::Video, description: &str) -> Result<(), DecodeError> {
        let index = self.decoded;
        self.decoded += 1;
        if frame.width() == 0
            || frame.height() == 0
            || frame.format() == ffmpeg::format::Pixel::None
        {
            return Err(DecodeError::corrupt(
                FORMAT,
                format!("{description}: frame {index} has no picture"),
            ));
        }
        let output = match &mut self.output {
            Some(output) => output,
            None => self.output.insert(Output::allocate(frame, &self.options)?),
        };
        let wanted =
            index >= self.options.start && (index - self.options.start) % self.options.stride == 0;
        if !wanted {
            return Ok(());
        }
        let frame_bytes = output.height * output.width * 3;
        let offset = self.collected * frame_bytes;
        let target = &mut output.data[offset..offset + frame_bytes];
        Scaler::convert(&mut self.scaler, frame, target, output.height, output.width).map_err(
            |reason| {
                DecodeError::unsupported(FORMAT, format!("{description}: frame {index}: {reason}"))
            },
        )?;
        self.collected += 1;
        Ok(())
    }

    fn finish(self) -> DecodedVideo {
        let output = self.output.expect("a done collector has converted frames");
        DecodedVideo {
            frames: self.collected,
            height: output.height,
            width: output.width,
            data: output.data,
        }
    }
}

impl Output {
    /// The output for all frames, sized from the first decoded frame (or
    /// `size`), once the size is checked against the cap.
    fn allocate(first: &ffmpeg::frame::Video, options: &VideoOptions) -> Result<Self, DecodeError> {
        let frame_pixels = u64::from(first.width()) * u64::from(first.height());
        DecodeError::check_size(FORMAT, frame_pixels, options.max_pixels)?;
        let (height, width) = options
            .size
            .unwrap_or((first.height() as usize, first.width() as usize));
        let pixels = (height as u64)
            .saturating_mul(width as u64)
            .saturating_mul(options.num_frames as u64);
        DecodeError::check_size(FORMAT, pixels, options.max_pixels)?;
        Ok(Output {
            height,
            width,
            // Zeroed pages come from the OS untouched until swscale writes.
            data: vec![0; pixels as usize * 3],
        })
    }
}

/// A swscale context from one kind of frame to RGB24 of the output size,
/// remade when the frames change.
struct Scaler {
    context: *mut ffi::SwsContext,
    key: ScalerKey,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ScalerKey {
    width: c_int,
    height: c_int,
    format: ffi::AVPixelFormat,
    colorspace: ffi::AVColorSpace,
    full_range: bool,
    out_width: c_int,
    out_height: c_int,
}

impl Scaler {
    /// Converts `frame` into `target`, `height` rows of `width` RGB pixels.
    fn convert(
        slot: &mut Option<Scaler>,
        frame: &ffmpeg::frame::Video,
        target: &mut [u8],
        height: usize,
        width: usize,
    ) -> Result<(), String> {
        debug_assert_eq!(target.len(), height * width * 3);
        let key = ScalerKey::of(frame, height, width);
        let scaler = match slot {
            Some(scaler) if scaler.key == key => scaler,
            _ => {
                *slot = None;
                slot.insert(Scaler::new(key)?)
            }
        };
        let out_stride = (width * 3) as c_int;
        if out_stride as usize != width * 3 {
            return Err(format!("a row of {width} pixels is too wide for swscale"));
        }
        let planes: [*mut u8; 4] = [
            target.as_mut_ptr(),
            ptr::null_mut(),
            ptr::null_mut(),
            ptr::null_mut(),
        ];
        let strides: [c_int; 4] = [out_stride, 0, 0, 0];
        // SAFETY: the context was made for this frame's size and format
        // (the key), the frame's planes and line sizes are the decoder's
        // and valid while `frame` is borrowed, and swscale writes
        // `key.out_height` rows of `out_stride` bytes from `target`, which
        // is exactly `target.len()` bytes.
        let rows = unsafe {
            let av_frame = frame.as_ptr();
            ffi::sws_scale(
                scaler.context,
                (*av_frame).data.as_ptr() as *const *const u8,
                (*av_frame).linesize.as_ptr(),
                0,
                (*av_frame).height,
                planes.as_ptr(),
                strides.as_ptr(),
            )
        };
        if rows != key.out_height {
            return Err(format!(
                "swscale converted {rows} of {} rows",
                key.out_height
            ));
        }
        Ok(())
    }

    fn new(key: ScalerKey) -> Result<Self, String> {
        let same_size = key.out_width == key.width && key.out_height == key.height;
        let shrinks = key.out_width <= key.width && key.out_height <= key.height;
        // At the same size only chroma is interpolated: bicubic, FFmpeg's
        // default, so that frames match `ffmpeg -pix_fmt rgb24`. Resizing:
        // area averaging when shrinking (no aliasing), bilinear otherwise.
        let flags = if same_size {
            ffi::SWS_BICUBIC
        } else if shrinks {
            ffi::SWS_AREA
        } else {
            ffi::SWS_BILINEAR
        };
        // SAFETY: plain constructor with valid sizes and formats; null
        // filters and parameters select swscale's defaults. Null on failure.
        let context = unsafe {
            ffi::sws_getContext(
                key.width,
                key.height,
                key.format,
                key.out_width,
                key.out_height,
                ffi::AVPixelFormat::AV_PIX_FMT_RGB24,
                flags,
                ptr::null_mut(),
                ptr::null_mut(),
                ptr::null(),
            )
        };
        if context.is_null() {
            return Err(format!(
                "swscale cannot convert {:?} at {}x{} to RGB",
                key.format, key.width, key.height
            ));
        }
        let scaler = Scaler { context, key };
        if is_yuv(key.format) {
            // The frame's matrix and range: swscale assumes BT.601 and
            // limited range otherwise, shifting colours of HD (BT.709) and
            // full-range video.
            // SAFETY: `context` is valid; sws_getCoefficients returns a
            // static table for any value (the default for unknown ones).
            unsafe {
                let source_table = ffi::sws_getCoefficients(key.colorspace as c_int);
                let rgb_table = ffi::sws_getCoefficients(ffi::SWS_CS_DEFAULT);
                ffi::sws_setColorspaceDetails(
                    scaler.context,
                    source_table,
                    c_int::from(key.full_range),
                    rgb_table,
                    1,
                    0,
                    1 << 16,
                    1 << 16,
                );
            }
        }
        Ok(scaler)
    }
}

impl Drop for Scaler {
    fn drop(&mut self) {
        // SAFETY: the context came from sws_getContext and is freed once.
        unsafe { ffi::sws_freeContext(self.context) };
    }
}

impl ScalerKey {
    fn of(frame: &ffmpeg::frame::Video, height: usize, width: usize) -> Self {
        let format: ffi::AVPixelFormat = frame.format().into();
        // SAFETY: the frame is a decoded, valid AVFrame.
        let (colorspace, range) = unsafe {
            let av_frame = frame.as_ptr();
            ((*av_frame).colorspace, (*av_frame).color_range)
        };
        use ffi::AVPixelFormat as F;
        // The deprecated yuvj formats are full range whatever the frame says.
        let jpeg_format = matches!(
            format,
            F::AV_PIX_FMT_YUVJ420P
                | F::AV_PIX_FMT_YUVJ422P
                | F::AV_PIX_FMT_YUVJ444P
                | F::AV_PIX_FMT_YUVJ440P
                | F::AV_PIX_FMT_YUVJ411P
        );
        ScalerKey {
            width: frame.width() as c_int,
            height: frame.height() as c_int,
            format,
            colorspace,
            full_range: jpeg_format || range == ffi::AVColorRange::AVCOL_RANGE_JPEG,
            out_width: width as c_int,
            out_height: height as c_int,
        }
    }
}

/// Whether `format` is a YUV format (three components, not RGB, not a
/// palette or Bayer pattern).
fn is_yuv(format: ffi::AVPixelFormat) -> bool {
    // SAFETY: returns null or a static descriptor.
    let descriptor = unsafe { ffi::av_pix_fmt_desc_get(format) };
    if descriptor.is_null() {
        return false;
    }
    // SAFETY: non-null, static.
    let descriptor = unsafe { &*descriptor };
    let not_yuv =
        (ffi::AV_PIX_FMT_FLAG_RGB | ffi::AV_PIX_FMT_FLAG_PAL | ffi::AV_PIX_FMT_FLAG_BAYER) as u64;
    descriptor.nb_components >= 3 && descriptor.flags & not_yuv == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A YUV4MPEG2 (raw, lossless) video of `frames` frames of `width` x
    /// `height`, full range, 4:4:4, frame i a solid gray of 8 * i.
    fn y4m(frames: usize, width: usize, height: usize) -> Vec<u8> {
        let mut data =
            format!("YUV4MPEG2 W{width} H{height} F25:1 Ip A1:1 C444 XCOLORRANGE=FULL\n")
                .into_bytes();
        for i in 0..frames {
            data.extend_from_slice(b"FRAME\n");
            data.resize(data.len() + width * height, (8 * i) as u8);
            data.resize(data.len() + 2 * width * height, 128);
        }
        data
    }

    fn decode(data: &[u8], options: &VideoOptions) -> Result<DecodedVideo, DecodeError> {
        decode_video(VideoSource::Bytes(data), options)
    }

    fn frame_levels(video: &DecodedVideo) -> Vec<u8> {
        let frame_bytes = video.height * video.width * 3;
        video
            .data
            .chunks(frame_bytes)
            .map(|frame| frame[0])
            .collect()
    }

    #[test]
    fn picks_frames_by_start_and_stride() {
        let data = y4m(12, 8, 6);
        let options = VideoOptions {
            start: 2,
            num_frames: 4,
            stride: 3,
            ..VideoOptions::new(4)
        };
        let video = decode(&data, &options).unwrap();
        assert_eq!((video.frames, video.height, video.width), (4, 6, 8));
        assert_eq!(video.data.len(), 4 * 6 * 8 * 3);
        assert_eq!(frame_levels(&video), [16, 40, 64, 88]);
        // Solid frames: every byte of a frame is its level.
        for (frame, level) in video.data.chunks(6 * 8 * 3).zip([16, 40, 64, 88]) {
            assert!(frame.iter().all(|&value| value.abs_diff(level) <= 1));
        }
    }

    #[test]
    fn resizes() {
        let data = y4m(3, 16, 12);
        let options = VideoOptions {
            size: Some((5, 7)),
            ..VideoOptions::new(3)
        };
        let video = decode(&data, &options).unwrap();
        assert_eq!((video.frames, video.height, video.width), (3, 5, 7));
        assert_eq!(frame_levels(&video), [0, 8, 16]);
    }

    #[test]
    fn too_few_frames_names_the_count() {
        let data = y4m(5, 4, 4);
        let options = VideoOptions {
            start: 1,
            stride: 2,
            ..VideoOptions::new(3)
        };
        let err = decode(&data, &options).unwrap_err();
        assert_eq!(
            err,
            DecodeError::TooFewFrames {
                frames: 5,
                last_index: 5
            }
        );
        let options = VideoOptions {
            start: 1,
            stride: 2,
            ..VideoOptions::new(2)
        };
        assert_eq!(frame_levels(&decode(&data, &options).unwrap()), [8, 24]);
    }

    #[test]
    fn refuses_output_over_the_cap_before_decoding() {
        let data = y4m(4, 10, 10);
        let options = VideoOptions {
            max_pixels: 399,
            ..VideoOptions::new(4)
        };
        let err = decode(&data, &options).unwrap_err();
        assert!(
            matches!(
                err,
                DecodeError::TooLarge {
                    pixels: 400,
                    limit: 399,
                    ..
                }
            ),
            "{err}"
        );
        let options = VideoOptions {
            max_pixels: 400,
            ..VideoOptions::new(4)
        };
        assert!(decode(&data, &options).is_ok());
        // Resized output or not, no decoded frame may exceed the cap.
        let options = VideoOptions {
            size: Some((1, 1)),
            max_pixels: 99,
            ..VideoOptions::new(4)
        };
        let err = decode(&data, &options).unwrap_err();
        assert!(
            matches!(
                err,
                DecodeError::TooLarge {
                    pixels: 100,
                    limit: 99,
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn bad_input_is_an_error() {
        let data = y4m(4, 8, 8);
        for bad in [&b""[..], b"not a video at all, just some text", &data[..40]] {
            let err = decode(bad, &VideoOptions::new(1)).unwrap_err();
            assert!(err.to_string().starts_with("video: "), "{err}");
        }
        // Cut in the middle of the third frame.
        let cut = &data[..data.len() - 8 * 8 * 3 - 50];
        assert!(decode(cut, &VideoOptions::new(2)).is_ok());
        let err = decode(cut, &VideoOptions::new(4)).unwrap_err();
        assert!(err.to_string().starts_with("video: "), "{err}");
    }

    #[test]
    fn log_prefixes_lose_their_addresses() {
        assert_eq!(
            without_addresses("[mov,mp4 @ 0x55d0c3f0a100] moov atom not found"),
            "[mov,mp4] moov atom not found"
        );
        assert_eq!(
            without_addresses("[a @ 0x1] [b @ 0x2] broken @ 0x"),
            "[a] [b] broken @ 0x"
        );
    }

    #[test]
    fn invalid_options() {
        let data = y4m(2, 4, 4);
        for options in [
            VideoOptions::new(0),
            VideoOptions {
                stride: 0,
                ..VideoOptions::new(1)
            },
            VideoOptions {
                size: Some((0, 4)),
                ..VideoOptions::new(1)
            },
        ] {
            let err = decode(&data, &options).unwrap_err();
            assert!(matches!(err, DecodeError::InvalidArgument(_)), "{err}");
        }
    }

    #[test]
    fn reads_a_path_and_reports_a_missing_one() {
        let data = y4m(3, 4, 4);
        let path =
            std::env::temp_dir().join(format!("minato-video-test-{}.y4m", std::process::id()));
        std::fs::write(&path, &data).unwrap();
        let from_path = decode_video(VideoSource::Path(&path), &VideoOptions::new(3));
        std::fs::remove_file(&path).unwrap();
        assert_eq!(
            from_path.unwrap(),
            decode(&data, &VideoOptions::new(3)).unwrap()
        );
        let err = decode_video(
            VideoSource::Path(Path::new("/dev/zero")),
            &VideoOptions::new(1),
        );
        assert!(matches!(err, Err(DecodeError::Io { .. })), "{err:?}");
        let err = decode_video(VideoSource::Path(&path), &VideoOptions::new(1)).unwrap_err();
        assert!(
            matches!(
                err,
                DecodeError::Io {
                    kind: std::io::ErrorKind::NotFound,
                    ..
                }
            ),
            "{err}"
        );
    }
}
