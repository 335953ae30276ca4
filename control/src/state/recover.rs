//! Recovery of a restarted controller. Before step 3 nothing has moved, so a migration is
//! rolled back (the blocked ranks lost their connection and go on; the daemon re-plans if
//! the condition persists). During step 3 the hypervisors are the truth: each VM is asked
//! where it runs, and the migration is finished or rolled back accordingly.

use super::journal::{MigrationId, MigrationState};
use super::{ControllerError, StateDb};
use monitor::{NodeName, VmId};
use serde::Serialize;

/// Why a locator could not tell where a VM runs, as its implementor reports it (the
/// controller knows no hypervisor, so the error is boxed; callers may downcast it).
pub type LocateError = Box<dyn std::error::Error + Send + Sync>;

/// Asks the virtualization layer which node a VM actually runs on now.
pub trait VmLocator {
    fn locate(&mut self, vm: &VmId) -> Result<Option<NodeName>, LocateError>;
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Recovered {
    pub id: MigrationId,
    pub was: MigrationState,
    pub now: MigrationState,
    pub note: String,
}

impl StateDb {
    pub fn recover(
        &mut self,
        locator: &mut dyn VmLocator,
    ) -> Result<Vec<Recovered>, ControllerError> {
        let mut out = Vec::new();
        for m in self.migrations(None, true)? {
            if m.state != MigrationState::Migrating {
                let note = format!(
                    "controller restarted in state {}: nothing moved, notice withdrawn",
                    m.state.as_str()
                );
                self.roll_back(m.id, &note)?;
                out.push(Recovered {
                    id: m.id,
                    was: m.state,
                    now: MigrationState::RolledBack,
                    note,
                });
                continue;
            }
            let mut at_source = Vec::new();
            for mv in m.moves.iter().filter(|mv| !mv.moved) {
                let at = locator
                    .locate(&mv.vm)
                    .map_err(|source| ControllerError::Locate {
                        vm: mv.vm.to_string(),
                        source,
                    })?;
                match at {
                    Some(n) if n == mv.dest => self.recover_move(m.id, &mv.vm)?,
                    Some(n) if n == m.source => at_source.push(mv.vm.to_string()),
                    other => {
                        return Err(ControllerError::Misplaced {
                            vm: mv.vm.to_string(),
                            at: other.map_or_else(|| "no node".into(), |n| n.to_string()),
                            source_node: m.source.to_string(),
                            dest: mv.dest.to_string(),
                        });
                    }
                }
            }
            if at_source.is_empty() {
                let note = "controller restarted mid-migration: every VM found on its destination"
                    .to_string();
                self.complete(m.id, &note)?;
                out.push(Recovered {
                    id: m.id,
                    was: m.state,
                    now: MigrationState::Done,
                    note,
                });
            } else {
                let note = format!(
                    "controller restarted mid-migration: {} still on the source, rolled back",
                    at_source.join(", ")
                );
                self.roll_back(m.id, &note)?;
                out.push(Recovered {
                    id: m.id,
                    was: m.state,
                    now: MigrationState::RolledBack,
                    note,
                });
            }
        }
        Ok(out)
    }
}
