//! The loader's batch arenas (see `arena.rs`): which submitted batch each
//! sample would join and at which place, the arena each such batch is lent
//! when its first sample goes out, and the arenas' reuse.
//!
//! An arena is lent out as a [`Lease`]; the tasks in flight for its batch,
//! the leaves that arrived in it and a batch tensor made of it each hold the
//! lease, and the last to go gives the arena back: moved to its next
//! generation and kept for another batch, or unmapped where a leaf in it was
//! left mid-write. Worker processes are told of each arena once (its
//! descriptor beside a task) and told to forget the ones unmapped.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use super::arena::{Arena, ArenaLayout};

/// Arenas kept for reuse, at most, and their bytes at most (large batches
/// keep fewer): more are unmapped as they come back, so that a loader at
/// rest does not keep its busiest moment's memory.
pub const MAX_FREE_ARENAS: usize = 64;
pub const MAX_FREE_BYTES: usize = 1 << 30;
/// Free arenas no lend needed over this many lends in a row are unmapped,
/// all but `SPARE_FREE_ARENAS`: a loop that once held many batches (a
/// `list(loader)`) does not keep their memory for the rest of a persistent
/// loader's life, as torch's shared memory goes with its batches.
pub const TRIM_AFTER_LENDS: u32 = 32;
pub const SPARE_FREE_ARENAS: usize = 1;
/// Batches in a row that could not be handed out as they lay before arenas
/// stop being lent (samples that never keep their places: `in_order=False`,
/// or leaves whose sizes vary).
pub const MAX_MISSES: u32 = 8;

/// A sample's place: its batch's arena, the arena's generation, the place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Destination {
    pub arena: u32,
    pub generation: u64,
    pub place: u32,
}

/// An arena lent to one batch; it goes back to the pool when dropped.
#[derive(Debug)]
pub struct Lease {
    pool: Weak<Mutex<PoolState>>,
    id: u32,
    generation: u64,
    arena: Option<Arena>,
}

impl Lease {
    pub fn id(&self) -> u32 {
        self.id
    }

    pub fn generation(&self) -> u64 {
        self.generation
    }

    pub fn arena(&self) -> &Arena {
        self.arena
            .as_ref()
            .expect("an arena until the lease is dropped")
    }

    /// Whether a batch of this arena's leaves was handed out as it lay (see
    /// `ArenaPool::report`); what lending's stop let go, if it stopped now.
    pub fn report(&self, hit: bool) -> Stopped {
        let Some(pool) = self.pool.upgrade() else {
            return Stopped::default();
        };
        let mut state = pool
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        report(&mut state, hit)
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let Some(arena) = self.arena.take() else {
            return;
        };
        let Some(pool) = self.pool.upgrade() else {
            return; // the pool is gone: the arena is unmapped
        };
        let mut state = pool
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        state.live.remove(&self.id);
        let reusable = !state.disabled
            && state.free.len() < MAX_FREE_ARENAS
            && (state.free.len() + 1) * arena.layout().size() <= MAX_FREE_BYTES
            && state.layout.as_ref() == Some(arena.layout())
            && arena.next_generation(self.generation);
        if reusable {
            state.free.push((self.id, arena, self.generation + 1));
        } else {
            state.dropped.insert(self.id);
        }
    }
}

/// A submitted batch's fresh samples: epoch positions `first..first + count`
/// take places `offset..offset + count`.
#[derive(Debug)]
struct Expected {
    offset: usize,
    count: usize,
    handed: usize,
    lease: Option<Arc<Lease>>,
}

#[derive(Debug, Default)]
struct PoolState {
    layout: Option<ArenaLayout>,
    disabled: bool,
    misses: u32,
    next_id: u32,
    free: Vec<(u32, Arena, u64)>,
    /// Lends since the free arenas were last trimmed, and the fewest free
    /// arenas any of them left idle (see `TRIM_AFTER_LENDS`).
    lends: u32,
    fewest_free: Option<usize>,
    live: HashMap<u32, Weak<Lease>>,
    /// This epoch's, by first position.
    expected: BTreeMap<u64, Expected>,
    /// Arenas unmapped, which workers that mapped them should forget.
    dropped: HashSet<u32>,
    announced: HashMap<usize, HashSet<u32>>,
}

/// A task's places: one per sample (None where it has none), the leases to
/// hold until its answer is read, the arenas to announce to its worker and
/// those it should forget.
#[derive(Debug, Default)]
pub struct Placement {
    pub destinations: Vec<Option<Destination>>,
    pub leases: Vec<Arc<Lease>>,
    pub announce: Vec<Arc<Lease>>,
    pub forget: Vec<u32>,
    /// Free arenas trimmed by this placement: unmapped as it goes, once
    /// the pool's lock is let go.
    pub retired: Vec<Arena>,
}

/// The loader's arenas, shared by its worker threads and its collate.
#[derive(Debug)]
pub struct ArenaPool {
    /// Places per arena: the loader's batch size.
    places: usize,
    state: Arc<Mutex<PoolState>>,
}

impl ArenaPool {
    fn state(&self) -> MutexGuard<'_, PoolState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A pool of arenas for batches of `places` samples.
    pub fn new(places: usize) -> ArenaPool {
        ArenaPool {
            places,
            state: Arc::default(),
        }
    }

    /// The samples' leaf sizes, as a worker process first saw them: the
    /// first offer sets the layout.
    pub fn offer_layout(&self, leaf_bytes: Vec<usize>) {
        let mut state = self.state();
        if state.layout.is_none() && !state.disabled {
            state.layout = ArenaLayout::new(self.places, leaf_bytes);
        }
    }

    pub fn layout(&self) -> Option<ArenaLayout> {
        self.state().layout.clone()
    }

    /// Whether arenas are being lent.
    pub fn active(&self) -> bool {
        let state = self.state();
        state.layout.is_some() && !state.disabled
    }

    /// A batch was submitted: its fresh samples, at epoch positions
    /// `first..first + count`, would take places `offset..`.
    pub fn expect(&self, first: u64, offset: usize, count: usize) {
        let mut state = self.state();
        if state.disabled || count == 0 {
            return;
        }
        state.expected.insert(
            first,
            Expected {
                offset,
                count,
                handed: 0,
                lease: None,
            },
        );
    }

    /// A new epoch: its positions start again, and no task of the last one
    /// is sent any more.
    pub fn new_epoch(&self) {
        // Dropped once the lock is let go: a lease's drop takes it.
        let _records = std::mem::take(&mut self.state().expected);
    }

    /// The places of a task's samples (epoch positions), going to worker
    /// `worker`.
    pub fn place(&self, worker: usize, positions: &[u64]) -> Placement {
        let mut placement = Placement::default();
        let mut guard = self.state();
        let state = &mut *guard;
        if let Some(known) = state.announced.get_mut(&worker) {
            if !state.dropped.is_empty() {
                placement.forget = known.intersection(&state.dropped).copied().collect();
                for id in &placement.forget {
                    known.remove(id);
                }
            }
        }
        let Some(layout) = state.layout.clone().filter(|_| !state.disabled) else {
            placement.destinations = vec![None; positions.len()];
            return placement;
        };
        for &position in positions {
            let destination = self.destination(state, &layout, worker, position, &mut placement);
            placement.destinations.push(destination);
        }
        placement
    }

    fn destination(
        &self,
        state: &mut PoolState,
        layout: &ArenaLayout,
        worker: usize,
        position: u64,
        placement: &mut Placement,
    ) -> Option<Destination> {
        let (&first, expected) = state.expected.range_mut(..=position).next_back()?;
        if position >= first + expected.count as u64 {
            return None;
        }
        let place = expected.offset + (position - first) as usize;
        if place >= layout.places {
            return None;
        }
        if expected.lease.is_none() {
            placement.retired.extend(trim(
                &mut state.free,
                &mut state.dropped,
                &mut state.lends,
                &mut state.fewest_free,
            ));
            let (id, arena, generation) = match state.free.pop() {
                Some(free) => free,
                None => {
                    let Ok(arena) = Arena::create(layout.clone()) else {
                        state.disabled = true; // no shared memory here: slots only
                        return None;
                    };
                    state.next_id += 1;
                    (state.next_id, arena, 0)
                }
            };
            let lease = Arc::new(Lease {
                pool: Arc::downgrade(&self.state),
                id,
                generation,
                arena: Some(arena),
            });
            state.live.insert(id, Arc::downgrade(&lease));
            expected.lease = Some(lease);
        }
        let lease = expected.lease.clone().expect("lent above");
        expected.handed += 1;
        if expected.handed == expected.count {
            state.expected.remove(&first);
        }
        let destination = Destination {
            arena: lease.id,
            generation: lease.generation,
            place: place as u32,
        };
        if state.announced.entry(worker).or_default().insert(lease.id) {
            placement.announce.push(lease.clone());
        }
        if !placement.leases.iter().any(|held| held.id == lease.id) {
            placement.leases.push(lease);
        }
        Some(destination)
    }

    /// A task's announcement was not sent: its worker does not know them.
    pub fn unannounce(&self, worker: usize, ids: &[u32]) {
        if let Some(known) = self.state().announced.get_mut(&worker) {
            for id in ids {
                known.remove(id);
            }
        }
    }

    /// A worker process is gone (or replaced): it knows no arena.
    pub fn forget_worker(&self, worker: usize) {
        self.state().announced.remove(&worker);
    }

    /// The lease of arena `id` in `generation`, while it is lent.
    pub fn lease(&self, id: u32, generation: u64) -> Option<Arc<Lease>> {
        let lease = self.state().live.get(&id)?.upgrade()?;
        (lease.generation == generation).then_some(lease)
    }

    /// Whether a collated batch could be handed out as it lay in its arena;
    /// after `MAX_MISSES` misses in a row no arena is lent any more.
    pub fn report(&self, hit: bool) -> Stopped {
        report(&mut self.state(), hit)
    }

    /// Arenas kept for reuse (for tests).
    pub fn free_arenas(&self) -> usize {
        self.state().free.len()
    }

    /// Arenas lent now (for tests).
    pub fn lent_arenas(&self) -> usize {
        self.state().live.len()
    }
}

/// Counts a lend about to take one of `free`; after `TRIM_AFTER_LENDS` of
/// them, takes out the free arenas none of them needed (those every lend
/// left idle, all but `SPARE_FREE_ARENAS`), recorded as dropped so that
/// workers forget them.
fn trim(
    free: &mut Vec<(u32, Arena, u64)>,
    dropped: &mut HashSet<u32>,
    lends: &mut u32,
    fewest_free: &mut Option<usize>,
) -> Vec<Arena> {
    let idle = free.len().saturating_sub(1);
    let fewest = fewest_free.map_or(idle, |fewest| fewest.min(idle));
    *lends += 1;
    if *lends < TRIM_AFTER_LENDS {
        *fewest_free = Some(fewest);
        return Vec::new();
    }
    *lends = 0;
    *fewest_free = None;
    let surplus = fewest.saturating_sub(SPARE_FREE_ARENAS);
    // The longest unused first: the free list is a stack.
    free.drain(..surplus)
        .map(|(id, arena, _)| {
            dropped.insert(id);
            arena
        })
        .collect()
}

/// What lending's stop let go: the batches' records, which hold leases (a
/// lease's drop takes the pool's lock), and the free arenas, whose
/// unmapping takes a while. Dropped once the pool's lock is let go; the
/// arenas best where no other lock is held either (see `into_arenas`).
#[must_use]
#[derive(Default)]
pub struct Stopped {
    records: BTreeMap<u64, Expected>,
    arenas: Vec<Arena>,
}

impl Stopped {
    /// Drops the records now; returns the free arenas, to unmap.
    pub fn into_arenas(self) -> Vec<Arena> {
        drop(self.records);
        self.arenas
    }
}

/// Counts a hit or a miss; past `MAX_MISSES` in a row, lending stops and
/// what it let go is returned, to be dropped once the lock is let go.
fn report(state: &mut PoolState, hit: bool) -> Stopped {
    if hit {
        state.misses = 0;
        return Stopped::default();
    }
    state.misses += 1;
    if state.misses < MAX_MISSES || state.disabled {
        return Stopped::default();
    }
    state.disabled = true;
    let free = std::mem::take(&mut state.free);
    state.dropped.extend(free.iter().map(|(id, _, _)| *id));
    Stopped {
        records: std::mem::take(&mut state.expected),
        arenas: free.into_iter().map(|(_, arena, _)| arena).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool() -> ArenaPool {
        let pool = ArenaPool::new(4);
        pool.offer_layout(vec![4096, 8]);
        pool
    }

    #[test]
    fn samples_of_one_batch_share_its_arena_at_their_places() {
        let pool = pool();
        pool.expect(10, 1, 3); // positions 10..13 take places 1..4
        let first = pool.place(0, &[11, 10]);
        let places: Vec<u32> = first
            .destinations
            .iter()
            .map(|d| d.unwrap().place)
            .collect();
        assert_eq!(places, vec![2, 1]);
        assert_eq!(first.announce.len(), 1);
        assert_eq!(first.leases.len(), 1);
        let second = pool.place(0, &[12, 13, 9]);
        assert_eq!(second.destinations[0].unwrap().place, 3);
        assert!(second.destinations[1].is_none() && second.destinations[2].is_none());
        assert!(
            second.announce.is_empty(),
            "announced to this worker already"
        );
        pool.expect(30, 0, 1);
        pool.new_epoch();
        assert_eq!(
            pool.place(1, &[30]).destinations,
            vec![None],
            "another epoch"
        );
        let id = first.destinations[0].unwrap().arena;
        assert!(pool.lease(id, 0).is_some());
        drop((first, second));
        assert!(
            pool.lease(id, 0).is_none(),
            "every sample handed out, nothing holds it"
        );
        assert_eq!(pool.free_arenas(), 1);
        pool.expect(20, 0, 1);
        let reused = pool.place(0, &[20]);
        assert_eq!(reused.destinations[0].unwrap().arena, id);
        assert_eq!(reused.destinations[0].unwrap().generation, 1);
    }

    #[test]
    fn an_arena_left_mid_write_is_dropped_and_forgotten() {
        let pool = pool();
        pool.expect(0, 0, 1);
        let placement = pool.place(7, &[0]);
        let destination = placement.destinations[0].unwrap();
        let lease = placement.leases[0].clone();
        // A writer claims the leaf and dies before finishing it.
        let worker = Arena::map(
            lease.arena().fd().unwrap(),
            pool.layout().unwrap(),
            pool.layout().unwrap().size(),
        )
        .unwrap();
        assert!(worker.place(destination.generation, 0, 1, &[1; 8]));
        drop(worker);
        drop((placement, lease));
        assert_eq!(pool.free_arenas(), 1, "a finished write does not keep it");
        pool.expect(1, 0, 1);
        let placement = pool.place(7, &[1]);
        let lease = placement.leases[0].clone();
        // Mark a leaf mid-write through the worker's own mapping.
        let layout = pool.layout().unwrap();
        let worker =
            Arena::map(lease.arena().fd().unwrap(), layout.clone(), layout.size()).unwrap();
        let word = worker.segment().at(0) as *const std::sync::atomic::AtomicU64;
        // SAFETY: the first header word, aligned, accessed atomically.
        unsafe { &*word }.store(1 << 2 | 1, std::sync::atomic::Ordering::Release);
        drop((placement, lease));
        assert_eq!(pool.free_arenas(), 0);
        assert_eq!(pool.place(7, &[]).forget, vec![1]);
    }

    #[test]
    fn misses_in_a_row_stop_the_lending() {
        let pool = pool();
        for _ in 0..MAX_MISSES - 1 {
            drop(pool.report(false));
        }
        drop(pool.report(true));
        for _ in 0..MAX_MISSES - 1 {
            drop(pool.report(false));
        }
        assert!(pool.active());
        drop(pool.report(false));
        assert!(!pool.active());
        pool.expect(0, 0, 1);
        assert_eq!(pool.place(0, &[0]).destinations, vec![None]);
    }

    #[test]
    fn records_holding_the_last_lease_are_let_go_without_a_deadlock() {
        let pool = pool();
        pool.expect(0, 0, 2);
        drop(pool.place(0, &[0])); // its record alone holds the arena now
        pool.new_epoch();
        assert_eq!(pool.lent_arenas(), 0);
        pool.expect(0, 0, 2);
        let placement = pool.place(0, &[0]);
        let lease = placement.leases[0].clone();
        drop(placement);
        for _ in 0..MAX_MISSES {
            // The last stops the lending and lets the record go.
            drop(lease.report(false));
        }
        drop(lease);
        assert_eq!(pool.lent_arenas(), 0);
    }

    #[test]
    fn the_free_arenas_a_stop_lets_go_are_returned_to_unmap_after_the_lock() {
        let pool = pool();
        let placements: Vec<Placement> = (0..3u64)
            .map(|batch| {
                pool.expect(batch, 0, 1);
                pool.place(0, &[batch])
            })
            .collect();
        drop(placements);
        pool.new_epoch();
        assert_eq!(pool.free_arenas(), 3);
        for _ in 0..MAX_MISSES - 1 {
            assert!(pool.report(false).into_arenas().is_empty());
        }
        let arenas = pool.report(false).into_arenas();
        assert_eq!(arenas.len(), 3, "taken out, still mapped");
        assert_eq!(pool.free_arenas(), 0);
        // Their unmapping takes no lock of the pool's.
        let held = pool.state();
        drop(arenas);
        drop(held);
        assert_eq!(pool.place(0, &[]).forget.len(), 3);
    }

    #[test]
    fn large_arenas_are_kept_for_reuse_within_a_budget() {
        let pool = ArenaPool::new(2);
        // 2 places of 200 MiB: 400 MiB and a page an arena, two kept at most.
        pool.offer_layout(vec![200 << 20]);
        let placements: Vec<Placement> = (0..4u64)
            .map(|batch| {
                pool.expect(batch * 2, 0, 1);
                pool.place(0, &[batch * 2])
            })
            .collect();
        assert_eq!(pool.lent_arenas(), 4);
        drop(placements);
        pool.new_epoch();
        assert_eq!(pool.lent_arenas(), 0);
        assert_eq!(
            pool.free_arenas(),
            MAX_FREE_BYTES / pool.layout().unwrap().size()
        );
    }

    #[test]
    fn free_arenas_no_lend_needed_are_unmapped_and_forgotten() {
        let pool = pool();
        // The loop holds 20 batches at once, then lets them all go.
        let held: Vec<Placement> = (0..20u64)
            .map(|batch| {
                pool.expect(batch, 0, 1);
                pool.place(3, &[batch])
            })
            .collect();
        let ids: HashSet<u32> = held
            .iter()
            .map(|placement| placement.destinations[0].unwrap().arena)
            .collect();
        drop(held);
        assert_eq!(pool.free_arenas(), 20);
        // Then one batch at a time, each gone before the next is lent.
        let mut forgotten = Vec::new();
        for batch in 20..20 + 2 * u64::from(TRIM_AFTER_LENDS) {
            pool.expect(batch, 0, 1);
            let placement = pool.place(3, &[batch]);
            forgotten.extend(placement.forget.iter().copied());
        }
        assert_eq!(pool.free_arenas(), SPARE_FREE_ARENAS + 1);
        assert_eq!(forgotten.len(), 20 - SPARE_FREE_ARENAS - 1);
        assert!(forgotten.iter().all(|id| ids.contains(id)));
        // A steady loop keeps what it uses.
        for batch in 100..100 + 2 * u64::from(TRIM_AFTER_LENDS) {
            pool.expect(batch, 0, 1);
            assert!(pool.place(3, &[batch]).forget.is_empty());
        }
        assert_eq!(pool.free_arenas(), SPARE_FREE_ARENAS + 1);
    }

    #[test]
    fn nothing_is_lent_before_the_layout_is_known() {
        let pool = ArenaPool::new(4);
        pool.expect(0, 0, 4);
        assert_eq!(pool.place(0, &[0, 1]).destinations, vec![None, None]);
        pool.offer_layout(vec![0]);
        assert!(!pool.active(), "no layout of empty leaves");
    }
}
