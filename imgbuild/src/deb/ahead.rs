//! Reading `.deb`s ahead of their unpacking. Decompressing the data tarballs is most of a
//! clean build's unpack time (xz: one core per stream), while writing their files must stay
//! in the lock's order (a later package's file replaces an earlier one's). So worker threads
//! verify and decompress the next packages into memory on every core, and the caller gets
//! them one by one, in order, to write them out.
//!
//! The largest packages are read first (a kernel's is 40% of a minimal image's decompression:
//! read in its turn, it ended the unpack alone on one core), then the others in order, a bounded
//! distance ahead of the caller. Every package is verified (size and SHA256 of all its
//! bytes) before the caller sees any of it. A data tarball larger than [`BUFFER_CAP`] is not
//! kept in memory: the caller streams it from the file itself. At most [`BUDGET`] bytes wait
//! for the caller, plus what the workers are reading (up to [`BUFFER_CAP`] each).

use super::archive::{ControlFiles, DebError, DebFile, member_error, read_deb};
use std::collections::BTreeMap;
use std::io;
use std::sync::{Condvar, Mutex};

/// Largest data tarball decompressed into memory ahead of its turn (a kernel's is ~100 MiB).
pub const BUFFER_CAP: u64 = 256 << 20;
/// How far the readers may run ahead of the caller, in packages and in buffered bytes.
const WINDOW: usize = 16;
const BUDGET: u64 = 512 << 20;

/// One package, read and verified.
pub enum Decoded {
    /// Its control files and its whole data tarball, decompressed.
    Buffered {
        control: ControlFiles,
        data: Vec<u8>,
    },
    /// Over [`BUFFER_CAP`]: read it again as a stream.
    Large,
}

impl Decoded {
    fn bytes(&self) -> u64 {
        match self {
            Decoded::Buffered { data, .. } => data.len() as u64,
            Decoded::Large => 0,
        }
    }
}

/// Why a worker stopped reading a package.
enum Fail {
    Deb(DebError),
    Large,
}

impl From<DebError> for Fail {
    fn from(e: DebError) -> Self {
        Fail::Deb(e)
    }
}

/// Reads `deb` whole; `limit` bounds its data tarball as in [`read_deb`].
pub fn decode(deb: &DebFile, limit: u64) -> Result<Decoded, DebError> {
    let cap = limit.min(BUFFER_CAP);
    let mut data = Vec::new();
    let read = read_deb(deb, cap, |tar| {
        tar.read_to_end(&mut data).map(drop).map_err(|e| {
            if e.kind() == io::ErrorKind::FileTooLarge && cap < limit {
                Fail::Large
            } else {
                Fail::Deb(member_error(&deb.path, "data.tar", limit, e))
            }
        })
    });
    match read {
        Ok(control) => Ok(Decoded::Buffered { control, data }),
        Err(Fail::Large) => Ok(Decoded::Large),
        Err(Fail::Deb(e)) => Err(e),
    }
}

/// What the workers and the caller share.
struct State {
    /// Whether a worker took each package.
    taken: Vec<bool>,
    left: usize,
    /// The package the caller waits for next.
    turn: usize,
    buffered: u64,
    ready: BTreeMap<usize, Result<Decoded, DebError>>,
    stop: bool,
}

impl State {
    /// The package a free worker reads now, if any may be read: the caller's turn whatever
    /// is buffered, else (within the budget) the largest packages first, so that the one
    /// that takes longest to decompress (a kernel) does not hold up the end, then the next
    /// ones in order.
    fn pick(&self, big: &[usize]) -> Option<usize> {
        let free = |i: &usize| !self.taken[*i];
        if self.turn < self.taken.len() && free(&self.turn) {
            return Some(self.turn);
        }
        if self.buffered >= BUDGET {
            return None;
        }
        let window = self.turn..(self.turn + WINDOW).min(self.taken.len());
        big.iter()
            .copied()
            .find(free)
            .or_else(|| window.into_iter().find(free))
    }
}

/// Packages over an eighth of all the bytes, largest first.
fn big_ones(debs: &[&DebFile]) -> Vec<usize> {
    let total: u64 = debs.iter().map(|d| d.size).sum();
    let mut big: Vec<usize> = (0..debs.len())
        .filter(|&i| debs[i].size >= total / 8)
        .collect();
    big.sort_by_key(|&i| std::cmp::Reverse(debs[i].size));
    big
}

/// Hands `each` every package of `debs`, read by [`decode`], in order; stops at its first
/// error and returns it. Up to `threads` workers read ahead.
pub fn for_each_in_order<E>(
    debs: &[&DebFile],
    limit: u64,
    threads: usize,
    mut each: impl FnMut(usize, Result<Decoded, DebError>) -> Result<(), E>,
) -> Result<(), E> {
    let big = big_ones(debs);
    let state = State {
        taken: vec![false; debs.len()],
        left: debs.len(),
        turn: 0,
        buffered: 0,
        ready: BTreeMap::new(),
        stop: false,
    };
    let shared = (Mutex::new(state), Condvar::new());
    let lock = || shared.0.lock().unwrap_or_else(|e| e.into_inner());
    let worker = || {
        loop {
            let i = {
                let mut st = lock();
                loop {
                    if st.stop || st.left == 0 {
                        return;
                    }
                    if let Some(i) = st.pick(&big) {
                        st.taken[i] = true;
                        st.left -= 1;
                        break i;
                    }
                    st = shared.1.wait(st).unwrap_or_else(|e| e.into_inner());
                }
            };
            let r =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| decode(debs[i], limit)))
                    .unwrap_or_else(|_| {
                        Err(DebError::Format {
                            deb: debs[i].path.clone(),
                            reason: "its reader panicked".into(),
                        })
                    });
            let mut st = lock();
            st.buffered += r.as_ref().map_or(0, Decoded::bytes);
            st.ready.insert(i, r);
            shared.1.notify_all();
        }
    };
    std::thread::scope(|s| {
        for _ in 0..threads.clamp(1, debs.len().max(1)) {
            s.spawn(worker);
        }
        // However the caller's side ends (done, an error, a panic), the workers stop, or the
        // scope would wait for them forever.
        let _stop = StopOnDrop(&shared);
        let mut result = Ok(());
        for i in 0..debs.len() {
            let r = {
                let mut st = lock();
                let r = loop {
                    if let Some(r) = st.ready.remove(&i) {
                        break r;
                    }
                    st = shared.1.wait(st).unwrap_or_else(|e| e.into_inner());
                };
                st.buffered -= r.as_ref().map_or(0, Decoded::bytes);
                st.turn = i + 1;
                shared.1.notify_all();
                r
            };
            result = each(i, r);
            if result.is_err() {
                break;
            }
        }
        result
    })
}

struct StopOnDrop<'a>(&'a (Mutex<State>, Condvar));

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.0.lock().unwrap_or_else(|e| e.into_inner()).stop = true;
        self.0.1.notify_all();
    }
}

/// The readers for this machine: one per core, at most four.
pub fn threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get().min(4))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(n: usize, turn: usize, taken: &[usize], buffered: u64) -> State {
        let mut t = vec![false; n];
        for &i in taken {
            t[i] = true;
        }
        State {
            left: t.iter().filter(|x| !**x).count(),
            taken: t,
            turn,
            buffered,
            ready: BTreeMap::new(),
            stop: false,
        }
    }

    #[test]
    fn the_callers_turn_first_then_the_big_ones_then_the_window() {
        let big = [30];
        // The caller waits for 0: nothing else comes first, whatever is buffered.
        assert_eq!(state(40, 0, &[], BUDGET).pick(&big), Some(0));
        assert_eq!(state(40, 0, &[0], 0).pick(&big), Some(30));
        assert_eq!(state(40, 0, &[0, 30], 0).pick(&big), Some(1));
        // Over the budget, only the caller's own turn is read.
        assert_eq!(state(40, 0, &[0], BUDGET).pick(&big), None);
        // Never more than the window ahead of the caller.
        let taken: Vec<usize> = (0..=WINDOW).chain([30]).collect();
        assert_eq!(state(40, 1, &taken, 0).pick(&big), None);
        assert_eq!(state(40, 2, &taken, 0).pick(&big), Some(WINDOW + 1));
    }

    #[test]
    fn only_packages_over_an_eighth_of_the_bytes_are_big() {
        let deb = |size| DebFile {
            path: "x.deb".into(),
            size,
            sha256: String::new(),
        };
        let debs = [deb(10), deb(300), deb(20), deb(500), deb(30)];
        let refs: Vec<&DebFile> = debs.iter().collect();
        assert_eq!(big_ones(&refs), [3, 1]);
    }
}
