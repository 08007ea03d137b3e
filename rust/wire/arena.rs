//! Batch arenas: worker processes write each sample's large leaves straight
//! into its place in a batch, so that a batch whose samples all arrive where
//! they were sent is handed out as it lies, with no copy in the loader.
//!
//! Sample slots (`slots.rs`) spare the worker a fresh segment per payload,
//! but the loader still copies every sample out of its slot into a new batch
//! tensor: on many cores that copy, its page faults and the threads doing
//! it are most of the loader's own CPU per sample (benchmarks/RESULTS.md).
//! torch's parent maps a batch a worker already built.
//!
//! When the loader submits a batch it knows which place each sample would
//! take; once it knows the layout of a sample's large leaves (their sizes,
//! learned from the first samples) it lends the batch an arena: shared memory
//! with one region per leaf, each holding that leaf of every place in turn,
//! as the stacked batch tensor lays it out. Each task tells its worker
//! process where its samples would go. The loader cannot promise a sample
//! its place: a late sample joins a later batch and the batch it left takes
//! another in its stead, copied. So every (place, leaf) has a word in the
//! arena's header, its `generation << 2 | state`, and a worker writes a leaf
//! only after moving that word from open to writing (a compare-and-swap, the
//! one ordering between the processes); a leaf that finds it taken, or from
//! an older generation, goes to the worker's slots as before. The loader
//! reuses an arena only once nothing refers to it (no batch, no leaf, no
//! task in flight) and every word moves to the next generation; one with a
//! leaf still being written (its worker killed mid-copy) is never reused.

use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicU64, Ordering};

use super::slots::Segment;

const PAGE: usize = 4096;
/// Each leaf's region starts on this boundary (any dtype's alignment).
const REGION_ALIGN: usize = 64;

const OPEN: u64 = 0;
const WRITING: u64 = 1;
const DONE: u64 = 2;
const STATE_BITS: u64 = 0b11;

/// Where an arena's regions lie: `leaf_bytes[m]` is leaf `m`'s size in one
/// sample; region `m` holds it for every place in turn.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArenaLayout {
    pub places: usize,
    pub leaf_bytes: Vec<usize>,
    region_offsets: Vec<usize>,
    size: usize,
}

impl ArenaLayout {
    /// The layout of `places` samples of leaves of `leaf_bytes` each, or
    /// None where there is nothing to lay out.
    pub fn new(places: usize, leaf_bytes: Vec<usize>) -> Option<ArenaLayout> {
        if places == 0 || leaf_bytes.is_empty() || leaf_bytes.contains(&0) {
            return None;
        }
        let header = (places * leaf_bytes.len() * 8).div_ceil(PAGE) * PAGE;
        let mut offset = header;
        let mut region_offsets = Vec::with_capacity(leaf_bytes.len());
        for &bytes in &leaf_bytes {
            region_offsets.push(offset);
            offset = (offset + places.checked_mul(bytes)?).div_ceil(REGION_ALIGN) * REGION_ALIGN;
        }
        Some(ArenaLayout {
            places,
            leaf_bytes,
            region_offsets,
            size: offset.div_ceil(PAGE) * PAGE,
        })
    }

    pub fn leaves(&self) -> usize {
        self.leaf_bytes.len()
    }

    /// The arena's size in bytes.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Region `leaf`'s offset in the arena.
    pub fn region_offset(&self, leaf: usize) -> usize {
        self.region_offsets[leaf]
    }

    /// Where leaf `leaf` of place `place` lies.
    pub fn offset(&self, place: usize, leaf: usize) -> usize {
        self.region_offsets[leaf] + place * self.leaf_bytes[leaf]
    }
}

/// One batch's shared memory, as the loader made it or a worker mapped it.
#[derive(Debug)]
pub struct Arena {
    segment: Segment,
    layout: ArenaLayout,
}

impl Arena {
    /// A new arena (all words open, generation 0), made by the loader.
    pub fn create(layout: ArenaLayout) -> std::io::Result<Arena> {
        let segment = Segment::create(c"minato-arena", layout.size())?;
        Ok(Arena { segment, layout })
    }

    /// The loader's arena `fd`, mapped by a worker process; refused unless
    /// the layout fills exactly the size announced.
    pub fn map(fd: BorrowedFd<'_>, layout: ArenaLayout, size: usize) -> std::io::Result<Arena> {
        if size != layout.size() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!(
                    "a batch arena of {size} bytes announced for a layout of {}",
                    layout.size()
                ),
            ));
        }
        let segment = Segment::map(fd, size)?;
        Ok(Arena { segment, layout })
    }

    pub fn layout(&self) -> &ArenaLayout {
        &self.layout
    }

    /// The descriptor, on the loader's side.
    pub fn fd(&self) -> Option<BorrowedFd<'_>> {
        self.segment.fd()
    }

    pub fn segment(&self) -> &Segment {
        &self.segment
    }

    fn word(&self, place: usize, leaf: usize) -> &AtomicU64 {
        assert!(place < self.layout.places && leaf < self.layout.leaves());
        let index = place * self.layout.leaves() + leaf;
        // SAFETY: the header holds places × leaves words of 8 bytes from the
        // segment's start (page-aligned, so each word is aligned); they are
        // only ever accessed atomically, here and in the other process.
        unsafe { &*(self.segment.at(index * 8) as *const AtomicU64) }
    }

    /// Writes `data` as leaf `leaf` of place `place` in generation
    /// `generation`, if that leaf is still open there (no other sample took
    /// it, and the loader has not moved the arena on). False leaves nothing
    /// written.
    pub fn place(&self, generation: u64, place: usize, leaf: usize, data: &[u8]) -> bool {
        if place >= self.layout.places
            || leaf >= self.layout.leaves()
            || data.len() != self.layout.leaf_bytes[leaf]
        {
            return false;
        }
        let word = self.word(place, leaf);
        let open = generation << 2 | OPEN;
        if word
            .compare_exchange(
                open,
                generation << 2 | WRITING,
                Ordering::AcqRel,
                Ordering::Relaxed,
            )
            .is_err()
        {
            return false;
        }
        let offset = self.layout.offset(place, leaf);
        // SAFETY: the bytes lie inside the segment (the layout's offsets),
        // and winning the word from open makes this the only writer of them
        // in this generation; the loader reads them only once the worker's
        // answer says they are written.
        let target = unsafe { std::slice::from_raw_parts_mut(self.segment.at(offset), data.len()) };
        target.copy_from_slice(data);
        word.store(generation << 2 | DONE, Ordering::Release);
        true
    }

    /// Moves every word from `generation` to the next, open; false (and the
    /// arena must not be reused) where a leaf is still being written.
    pub fn next_generation(&self, generation: u64) -> bool {
        let places = self.layout.places;
        let leaves = self.layout.leaves();
        for place in 0..places {
            for leaf in 0..leaves {
                let word = self.word(place, leaf);
                loop {
                    let current = word.load(Ordering::Acquire);
                    if current >> 2 != generation {
                        break; // already moved on
                    }
                    if current & STATE_BITS == WRITING {
                        return false;
                    }
                    if word
                        .compare_exchange(
                            current,
                            (generation + 1) << 2 | OPEN,
                            Ordering::AcqRel,
                            Ordering::Acquire,
                        )
                        .is_ok()
                    {
                        break;
                    }
                }
            }
        }
        true
    }

    /// Whether leaf `leaf` of place `place` was written in `generation`.
    pub fn written(&self, generation: u64, place: usize, leaf: usize) -> bool {
        place < self.layout.places
            && leaf < self.layout.leaves()
            && self.word(place, leaf).load(Ordering::Acquire) == generation << 2 | DONE
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout() -> ArenaLayout {
        ArenaLayout::new(4, vec![10_000, 3]).unwrap()
    }

    #[test]
    fn regions_lie_apart_and_aligned() {
        let layout = layout();
        assert_eq!(layout.region_offset(0) % PAGE, 0);
        assert!(layout.region_offset(1) >= layout.region_offset(0) + 4 * 10_000);
        assert_eq!(layout.region_offset(1) % REGION_ALIGN, 0);
        assert!(layout.size() >= layout.region_offset(1) + 12);
        assert!(ArenaLayout::new(0, vec![1]).is_none());
        assert!(ArenaLayout::new(4, vec![]).is_none());
        assert!(ArenaLayout::new(4, vec![0]).is_none());
    }

    #[test]
    fn a_worker_writes_a_place_once_and_the_loader_reads_it() {
        let loader = Arena::create(layout()).unwrap();
        let worker = Arena::map(loader.fd().unwrap(), layout(), layout().size()).unwrap();
        assert!(worker.place(0, 2, 0, &[7; 10_000]));
        assert!(
            !worker.place(0, 2, 0, &[8; 10_000]),
            "a place is written once"
        );
        assert!(
            !worker.place(1, 3, 0, &[8; 10_000]),
            "not in another generation"
        );
        assert!(
            !worker.place(0, 3, 0, &[8; 9_999]),
            "only a leaf of the layout's size"
        );
        assert!(
            !worker.place(0, 4, 0, &[8; 10_000]),
            "only a place of the arena"
        );
        assert!(loader.written(0, 2, 0));
        assert!(!loader.written(0, 3, 0));
        let offset = loader.layout().offset(2, 0);
        // SAFETY: the leaf lies inside the mapping.
        let read = unsafe { std::slice::from_raw_parts(loader.segment().at(offset), 10_000) };
        assert!(read.iter().all(|&byte| byte == 7));
        assert!(Arena::map(loader.fd().unwrap(), layout(), layout().size() + PAGE).is_err());
    }

    #[test]
    fn a_new_generation_refuses_the_old_ones_writers() {
        let arena = Arena::create(layout()).unwrap();
        assert!(arena.place(0, 0, 1, &[1, 2, 3]));
        assert!(arena.next_generation(0));
        assert!(!arena.written(1, 0, 1));
        assert!(
            !arena.place(0, 1, 0, &[0; 10_000]),
            "a late writer of generation 0"
        );
        assert!(arena.place(1, 1, 0, &[0; 10_000]));
        // A leaf left mid-write (its writer killed) keeps the arena from reuse.
        arena.word(2, 0).store(1 << 2 | WRITING, Ordering::Release);
        assert!(!arena.next_generation(1));
    }

    #[test]
    fn racing_writers_of_one_place_write_it_once() {
        let arena = std::sync::Arc::new(Arena::create(layout()).unwrap());
        for generation in 0..50u64 {
            let winners: usize = std::thread::scope(|scope| {
                let handles: Vec<_> = (0..4u8)
                    .map(|writer| {
                        let arena = arena.clone();
                        scope.spawn(move || {
                            usize::from(arena.place(generation, 1, 0, &[writer; 10_000]))
                        })
                    })
                    .collect();
                handles
                    .into_iter()
                    .map(|handle| handle.join().unwrap())
                    .sum()
            });
            assert_eq!(winners, 1);
            assert!(arena.next_generation(generation));
        }
    }
}
