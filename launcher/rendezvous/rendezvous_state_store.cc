// RendezvousState's key-value store and barriers: the token is checked,
// then the store (rendezvous/key_value_store.h) or the barriers
// (rendezvous/barriers.h) answer.

#include "rendezvous/rendezvous_state.h"

namespace ddp::launcher {

void RendezvousState::set(const Auth& auth, const std::string& key, const std::string& value) {
  check_auth(auth);
  store_.set(key, value);
}

std::optional<std::string> RendezvousState::get(const Auth& auth, const std::string& key) {
  check_auth(auth);
  return store_.get(key);
}

std::int64_t RendezvousState::add(const Auth& auth, const std::string& key, std::int64_t delta) {
  check_auth(auth);
  return store_.add(key, delta);
}

CompareSetOutcome RendezvousState::compare_set(const Auth& auth, const std::string& key,
                                               const std::string& expected,
                                               const std::string& desired) {
  check_auth(auth);
  return store_.compare_set(key, expected, desired);
}

bool RendezvousState::check(const Auth& auth, const std::vector<std::string>& keys) {
  check_auth(auth);
  return store_.check(keys);
}

bool RendezvousState::remove(const Auth& auth, const std::string& key) {
  check_auth(auth);
  return store_.remove(key);
}

std::int64_t RendezvousState::num_keys(const Auth& auth) {
  check_auth(auth);
  return store_.size();
}

BarrierTicket RendezvousState::barrier_arrive(const Auth& auth, const std::string& name, int rank,
                                              int world_size, const std::string& host,
                                              TimePoint deadline, TimePoint now) {
  check_auth(auth);
  tick(now);
  return barriers_.arrive(name, rank, world_size, host, deadline, now);
}

bool RendezvousState::barrier_passed(BarrierTicket ticket, TimePoint now) {
  tick(now);
  return barriers_.passed(ticket);
}

void RendezvousState::cancel(BarrierTicket ticket) { barriers_.cancel(ticket); }

}  // namespace ddp::launcher
