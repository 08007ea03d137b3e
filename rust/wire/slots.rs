//! Sample slots: a worker process writes each large tensor or array of a
//! sample into memory the loader has already mapped, instead of a fresh
//! shared-memory segment each. A payload copied into fresh shared memory
//! costs the worker process a page fault per page, and the loader a
//! mapping, its faults and an unmapping (benchmarks/sample_slots.py).
//! torch's workers pay the first cost once per batch they collate.
//!
//! Each worker process makes a ring of equal slots, sized by its first large
//! payload, in `memfd_create` segments it adds as it needs more slots (a
//! task of many cheap samples fills many at once), each sent to the loader
//! once (its descriptor beside a frame). The loader sees a slot's payload as
//! a `SlotLeaf` (rust/bindings/slots.rs): the collate stacks it straight into
//! the batch, or a tensor or array views it; once nothing does, the slot is
//! freed and goes back to the process with its next task. The process
//! reuses a slot only once it is back, so a sample is never overwritten
//! while anything can see it: that protocol, not a lock, orders who touches
//! a slot. A payload larger than a slot, or one that finds the ring full
//! (MAX_RING_BYTES of slots taken: a `collate_fn` that keeps its samples),
//! goes into fresh shared memory as before (minato/_process/ipc.py).

use std::collections::HashMap;
use std::ffi::{c_void, CStr};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::{Arc, Mutex};

/// Slots per shared-memory segment, at most...
pub const SEGMENT_SLOTS: usize = 32;
/// ...and a ring's memory at most, all its segments together: fewer slots
/// for larger payloads.
pub const MAX_RING_BYTES: usize = 64 << 20;
/// A ring of fewer slots than this is not made (payloads that large go the old way).
pub const MIN_SLOTS: usize = 4;
/// Tasks in a row that wrote nothing into a ring, all its slots back, before
/// its pages go back to the system: batch arenas carry the samples now (a
/// ring filled by each worker's first task otherwise stays resident for
/// nothing), or they have no large leaves. Not at once, so that a ring used
/// every few tasks keeps its warm pages.
pub const IDLE_TASKS_BEFORE_RELEASE: u32 = 4;
const PAGE: usize = 4096;

/// Shared memory, mapped readable and writable.
#[derive(Debug)]
pub struct Segment {
    /// The memory's descriptor, kept by the process that made it (to send).
    fd: Option<OwnedFd>,
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain memory valid until drop; who reads or writes
// which bytes is ordered by the slot protocol (module docs), as for any
// memory shared between processes.
unsafe impl Send for Segment {}
// SAFETY: as for Send: `&Segment` only hands out its address.
unsafe impl Sync for Segment {}

fn mmap_shared(fd: BorrowedFd<'_>, len: usize) -> std::io::Result<NonNull<u8>> {
    // SAFETY: a fresh shared mapping of `len` bytes of `fd`, at an address
    // the kernel picks; nothing else is mapped over.
    let address = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            0,
        )
    };
    if address == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error());
    }
    Ok(NonNull::new(address as *mut u8).expect("mmap never maps at 0"))
}

impl Segment {
    /// New shared memory of `len` bytes (zeroed), with its descriptor;
    /// `name` is what /proc's maps show for it.
    pub fn create(name: &CStr, len: usize) -> std::io::Result<Segment> {
        // SAFETY: `name` is NUL-terminated (a CStr); the descriptor returned
        // is new and owned here.
        let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `fd` was just returned by memfd_create, and nothing else owns it.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: ftruncate on the descriptor owned here.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let ptr = mmap_shared(fd.as_fd(), len)?;
        Ok(Segment {
            fd: Some(fd),
            ptr,
            len,
        })
    }

    /// Maps `len` bytes of the shared memory `fd` (another process's
    /// segment); the descriptor can be closed afterwards.
    pub fn map(fd: BorrowedFd<'_>, len: usize) -> std::io::Result<Segment> {
        let mut stat = std::mem::MaybeUninit::<libc::stat>::uninit();
        // SAFETY: fstat writes a stat into the buffer given.
        if unsafe { libc::fstat(fd.as_raw_fd(), stat.as_mut_ptr()) } < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: fstat succeeded, so it filled the stat.
        let size = unsafe { stat.assume_init() }.st_size;
        if len == 0 || (size as u64) < len as u64 {
            // Mapping past its end would fault on first touch.
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("a slot segment of {size} bytes announced as {len}"),
            ));
        }
        let ptr = mmap_shared(fd, len)?;
        Ok(Segment { fd: None, ptr, len })
    }

    pub fn fd(&self) -> Option<BorrowedFd<'_>> {
        self.fd.as_ref().map(AsFd::as_fd)
    }

    /// Gives the memory's pages back to the system, for every process that
    /// maps it: a later read sees zeros, a later write faults a fresh page.
    /// Only for memory nothing reads any more.
    pub fn release_pages(&self) -> std::io::Result<()> {
        let Some(fd) = &self.fd else {
            return Err(std::io::Error::from(std::io::ErrorKind::Unsupported));
        };
        // SAFETY: punches a hole over the whole of the descriptor owned
        // here; the mapping stays valid (its pages read as zeros).
        let punched = unsafe {
            libc::fallocate(
                fd.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                0,
                self.len as libc::off_t,
            )
        };
        if punched < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The address of byte `offset`.
    pub fn at(&self, offset: usize) -> *mut u8 {
        assert!(offset <= self.len);
        // SAFETY: `offset` is within the mapping (checked).
        unsafe { self.ptr.as_ptr().add(offset) }
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `create`/`map`, unmapped once; nothing
        // borrows it past the segment's life (slots hold an Arc of it).
        unsafe { libc::munmap(self.ptr.as_ptr() as *mut c_void, self.len) };
    }
}

/// A slot taken for a payload; `announce` is set on a segment's first use
/// (its descriptor must go with the message).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Taken {
    pub slot: u32,
    pub announce: Option<u32>,
}

/// The worker process's side: its ring, made at the first payload that
/// could use it, and which slots it may write.
#[derive(Debug, Default)]
pub struct SlotRing {
    segments: Vec<Segment>,
    slot_bytes: usize,
    segment_slots: usize,
    free: Vec<u32>,
    announced: Vec<bool>,
    unusable: bool,
    /// A slot was taken since the last task began.
    taken_this_task: bool,
    /// Tasks in a row that took no slot.
    idle_tasks: u32,
    /// Slots were written since the pages last went back.
    holds_pages: bool,
}

impl SlotRing {
    /// A free slot for a payload of `nbytes` (the most recently freed: its
    /// pages are warm), or None: too large, or the ring is full.
    pub fn take(&mut self, nbytes: usize) -> Option<Taken> {
        if self.unusable || (self.slot_bytes > 0 && nbytes > self.slot_bytes) {
            return None;
        }
        if self.free.is_empty() && !self.add_segment(nbytes) {
            return None;
        }
        let slot = self.free.pop()?;
        self.taken_this_task = true;
        self.holds_pages = true;
        let segment = slot as usize / self.segment_slots;
        let announce = if self.announced[segment] {
            None
        } else {
            self.announced[segment] = true;
            Some(segment as u32)
        };
        Some(Taken { slot, announce })
    }

    fn add_segment(&mut self, nbytes: usize) -> bool {
        if self.segments.is_empty() {
            self.slot_bytes = nbytes.max(1).div_ceil(PAGE) * PAGE;
            self.segment_slots = SEGMENT_SLOTS.min(MAX_RING_BYTES / self.slot_bytes);
            if self.segment_slots < MIN_SLOTS {
                self.unusable = true;
                return false;
            }
        }
        let segment_bytes = self.slot_bytes * self.segment_slots;
        if (self.segments.len() + 1) * segment_bytes > MAX_RING_BYTES {
            return false;
        }
        let Ok(segment) = Segment::create(c"minato-slots", segment_bytes) else {
            self.unusable = true; // no memfd here: payloads go the old way
            return false;
        };
        let first = (self.segments.len() * self.segment_slots) as u32;
        self.segments.push(segment);
        self.announced.push(false);
        self.free
            .extend((first..first + self.segment_slots as u32).rev());
        true
    }

    /// The slot's first `nbytes`, to write the payload into.
    pub fn bytes_mut(&mut self, slot: u32, nbytes: usize) -> &mut [u8] {
        let (segment, index) = (
            slot as usize / self.segment_slots,
            slot as usize % self.segment_slots,
        );
        assert!(nbytes <= self.slot_bytes);
        let segment = &self.segments[segment];
        // SAFETY: the slot lies inside its segment, it is this ring's (taken,
        // not yet sent), and `&mut self` makes this the only borrow of it here.
        unsafe { std::slice::from_raw_parts_mut(segment.at(index * self.slot_bytes), nbytes) }
    }

    /// Segment `segment`'s descriptor and size, to announce it.
    pub fn segment(&self, segment: u32) -> (BorrowedFd<'_>, usize) {
        let segment = &self.segments[segment as usize];
        (segment.fd().expect("a ring's own segment"), segment.len())
    }

    pub fn slot_bytes(&self) -> usize {
        self.slot_bytes
    }

    /// Its segments so far.
    pub fn segment_count(&self) -> usize {
        self.segments.len()
    }

    pub fn segment_slots(&self) -> usize {
        self.segment_slots
    }

    /// Slots taken for a message that was not sent, or handed back by the
    /// loader; `unannounce`: segments whose announcing message was not sent.
    pub fn give_back(&mut self, slots: &[u32], unannounce: &[u32]) {
        for &slot in slots {
            if (slot as usize) < self.segments.len() * self.segment_slots {
                self.free.push(slot);
            }
        }
        for &segment in unannounce {
            if let Some(flag) = self.announced.get_mut(segment as usize) {
                *flag = false;
            }
        }
    }

    pub fn free_slots(&self) -> usize {
        self.free.len()
    }

    /// A new task begins (its freed slots given back first). Once
    /// [`IDLE_TASKS_BEFORE_RELEASE`] tasks in a row took no slot and every
    /// slot is back, nothing can read the ring: its pages go back to the
    /// system. Returns whether they did.
    pub fn task_begins(&mut self) -> bool {
        if self.taken_this_task {
            self.idle_tasks = 0;
        } else {
            self.idle_tasks = self.idle_tasks.saturating_add(1);
        }
        self.taken_this_task = false;
        let all_back = self.free.len() == self.segments.len() * self.segment_slots;
        if !(self.holds_pages && all_back && self.idle_tasks >= IDLE_TASKS_BEFORE_RELEASE) {
            return false;
        }
        // A segment that cannot punch keeps its pages, as before.
        let mut released = true;
        for segment in &self.segments {
            released &= segment.release_pages().is_ok();
        }
        self.holds_pages = false;
        released
    }

    /// Whether written slots' pages may still be resident.
    pub fn holds_pages(&self) -> bool {
        self.holds_pages
    }
}

/// The loader's side of one worker process's ring: its mapping, and the
/// slots handed back since the last task went to the process.
#[derive(Debug, Default)]
pub struct SlotMap {
    mapped: Mutex<Mapped>,
    freed: Mutex<Vec<u32>>,
}

/// The segments mapped so far, and the ring's layout they announced.
#[derive(Debug, Default)]
struct Mapped {
    slot_bytes: usize,
    segment_slots: usize,
    segments: HashMap<u32, Arc<Segment>>,
}

impl SlotMap {
    /// The process's segment `segment`, from its descriptor.
    pub fn map(
        &self,
        segment: u32,
        fd: BorrowedFd<'_>,
        size: usize,
        slot_bytes: usize,
    ) -> std::io::Result<()> {
        if slot_bytes == 0 || size % slot_bytes != 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("a slot segment of {size} bytes in slots of {slot_bytes}"),
            ));
        }
        let segment_mapped = Arc::new(Segment::map(fd, size)?);
        let mut mapped = self.mapped.lock().expect("slot map");
        mapped.slot_bytes = slot_bytes;
        mapped.segment_slots = size / slot_bytes;
        mapped.segments.insert(segment, segment_mapped);
        Ok(())
    }

    /// Slot `slot`'s segment and its offset there, if `nbytes` fit in it.
    pub fn locate(&self, slot: u32, nbytes: usize) -> Option<(Arc<Segment>, usize)> {
        let mapped = self.mapped.lock().expect("slot map");
        let (slot_bytes, segment_slots) = (mapped.slot_bytes, mapped.segment_slots);
        if segment_slots == 0 || nbytes > slot_bytes {
            return None;
        }
        let (segment, index) = (slot as usize / segment_slots, slot as usize % segment_slots);
        let segment = mapped.segments.get(&(segment as u32))?.clone();
        Some((segment, index * slot_bytes))
    }

    /// Slot `slot` is no longer viewed: it goes back with the next task.
    pub fn free(&self, slot: u32) {
        self.freed.lock().expect("slot map").push(slot);
    }

    /// The slots freed since the last call.
    pub fn take_freed(&self) -> Vec<u32> {
        std::mem::take(&mut *self.freed.lock().expect("slot map"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_the_worker_writes_the_loader_reads() {
        let mut ring = SlotRing::default();
        let first = ring.take(100_000).unwrap();
        assert_eq!(first.announce, Some(0));
        ring.bytes_mut(first.slot, 100_000).fill(7);
        let second = ring.take(1000).unwrap();
        assert_eq!(second.announce, None);
        assert!(ring.take(ring.slot_bytes() + 1).is_none());
        let map = SlotMap::default();
        let (fd, size) = ring.segment(0);
        map.map(0, fd, size, ring.slot_bytes()).unwrap();
        let (segment, offset) = map.locate(first.slot, 100_000).unwrap();
        // SAFETY: the slot's bytes lie inside the mapped segment.
        let read = unsafe { std::slice::from_raw_parts(segment.at(offset), 100_000) };
        assert!(read.iter().all(|&byte| byte == 7));
        assert!(map.locate(first.slot, ring.slot_bytes() + 1).is_none());
        map.free(first.slot);
        map.free(second.slot);
        let freed = map.take_freed();
        assert_eq!(freed.len(), 2);
        let before = ring.free_slots();
        ring.give_back(&freed, &[]);
        assert_eq!(ring.free_slots(), before + 2);
    }

    #[test]
    fn a_ring_is_bounded_and_slots_are_never_handed_out_twice() {
        let mut ring = SlotRing::default();
        let mut taken = std::collections::HashSet::new();
        while let Some(slot) = ring.take(1 << 20) {
            assert!(taken.insert(slot.slot));
        }
        assert_eq!(taken.len() * (1 << 20), MAX_RING_BYTES);
        assert!(ring.take(1).is_none());
        // Too large for MIN_SLOTS slots in the ring: no ring at all.
        let mut huge = SlotRing::default();
        assert!(huge.take(MAX_RING_BYTES / 2).is_none());
    }

    #[test]
    fn a_ring_left_idle_gives_its_pages_back_once_every_slot_is_back() {
        let mut ring = SlotRing::default();
        let taken = ring.take(100_000).unwrap();
        ring.bytes_mut(taken.slot, 100_000).fill(7);
        let map = SlotMap::default();
        let (fd, size) = ring.segment(0);
        map.map(0, fd, size, ring.slot_bytes()).unwrap();
        // Still viewed by the loader: kept, however long the ring idles.
        for _ in 0..2 * IDLE_TASKS_BEFORE_RELEASE {
            assert!(!ring.task_begins());
        }
        ring.give_back(&[taken.slot], &[]);
        let (segment, offset) = map.locate(taken.slot, 100_000).unwrap();
        // SAFETY: the slot's bytes lie inside the mapped segment.
        let read = || unsafe { std::slice::from_raw_parts(segment.at(offset), 100_000) }.to_vec();
        assert!(read().iter().all(|&byte| byte == 7));
        // Idle tasks already counted: the next one releases.
        assert!(ring.task_begins());
        assert!(!ring.holds_pages());
        assert!(read().iter().all(|&byte| byte == 0), "the pages went back");
        assert!(!ring.task_begins(), "once");
        // Taken again, the slot is written as before.
        let again = ring.take(100_000).unwrap();
        ring.bytes_mut(again.slot, 100_000).fill(9);
        assert!(ring.holds_pages());
        let (segment, offset) = map.locate(again.slot, 100_000).unwrap();
        // SAFETY: as above.
        let read = unsafe { std::slice::from_raw_parts(segment.at(offset), 100_000) };
        assert!(read.iter().all(|&byte| byte == 9));
    }

    #[test]
    fn a_ring_used_every_few_tasks_keeps_its_pages() {
        let mut ring = SlotRing::default();
        for task in 0..10 * IDLE_TASKS_BEFORE_RELEASE {
            if task % IDLE_TASKS_BEFORE_RELEASE == 0 {
                let taken = ring.take(10_000).unwrap();
                ring.give_back(&[taken.slot], &[]);
            }
            assert!(!ring.task_begins(), "task {task}");
        }
        assert!(ring.holds_pages());
    }

    #[test]
    fn a_segment_shorter_than_announced_is_refused() {
        let segment = Segment::create(c"minato-slots", PAGE).unwrap();
        let map = SlotMap::default();
        assert!(map.map(0, segment.fd().unwrap(), 2 * PAGE, PAGE).is_err());
        assert!(map.map(0, segment.fd().unwrap(), PAGE, 100).is_err());
    }
}
