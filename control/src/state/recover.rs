//! Recovery of a restarted controller. Before step 3 nothing has moved, so a migration is
//! rolled back (the blocked ranks lost their connection and go on; the daemon re-plans if
//! the condition persists). During step 3 the hypervisors are the truth: each VM is asked
//! where it runs, and the migration is finished or rolled back accordingly.

use super::journal::{MigrationId, MigrationState};
use super::{ControllerError, StateDb};
use monitor::{NodeName, VmId};
use serde::Serialize;

/// Asks the virtualization layer which node a VM actually runs on now.
pub trait VmLocator {
    fn locate(&mut self, vm: &VmId) -> Result<Option<NodeName>, String>;
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
                    .map_err(|reason| ControllerError::Locate {
                        vm: mv.vm.to_string(),
                        reason,
                    })?;
                match at {
                    Some(n) if n == mv.dest => self.recover_move(m.id, &mv.vm)?,
                    Some(n) if n == m.source => at_source.push(mv.vm.to_string()),
                    other => {
                        return Err(ControllerError::Locate {
                            vm: mv.vm.to_string(),
                            reason: format!(
                                "it runs on {}, neither source {} nor destination {}; \
                                 hint: resolve by hand, then roll the migration back",
                                other
                                    .map(|n| n.to_string())
                                    .unwrap_or_else(|| "no node".into()),
                                m.source,
                                mv.dest
                            ),
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
