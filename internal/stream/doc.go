// Package stream is an ordered, bounded event buffer that many subscribers
// read at their own pace: one broker for the registry's plugin events and
// the servers' cluster events.
//
// # Batches and indexes
//
// A publisher appends batches of events with Publish. Each batch has an
// index greater than every earlier one; indexes need not be consecutive
// (the servers use raft indexes). Every event of a batch carries the batch's
// index, and a batch is delivered whole or not at all. The buffer keeps the
// newest Config.Size batches in a ring and drops the oldest when it is
// full, so its memory is bounded by Size batches whatever the subscribers
// do. A Publish without events only moves the latest index.
//
// # Pull, not push
//
// A push broker hands every event to every subscriber's queue: each Publish
// does work for each subscriber while it holds its lock, each queue is a
// copy of the backlog, and a full queue forces the broker to drop its
// subscriber at once. Here nothing is pushed. A subscription holds a position (the last batch it dealt with) and its
// filter, nothing else: no queue, no copy of the backlog. Next reads the
// ring from the position under a read lock and copies at most one dst of
// events, so hundreds or thousands of subscriptions read concurrently,
// a replay of the whole buffer costs no more memory than following, and a
// stalled subscriber costs nothing but its position. Publish takes the
// write lock briefly, never waits for a subscriber and does no work per
// subscriber: waiters take a channel under the read lock when they find
// nothing to read, and the next Publish closes it (off the publisher's
// goroutine), waking them all at once. Because the channel is taken in the
// same read-locked section that found nothing, no wake-up is lost.
//
// Finding where a subscription starts is a binary search over the ring
// (indexes grow but have gaps); after that a subscription moves batch by
// batch by sequence number, O(1) per batch.
//
// # Position and lag
//
// The lag of a subscription is the number of batches published after its
// position. Batches its filter does not want advance the position when it
// reads, and Next skips them before it measures the lag, so a filtered
// subscriber is not cut for events it does not want, only for leaving a
// wanted batch unread while more than MaxLag batches were published after
// it.
//
// A subscription is following once its lag has been MaxLag or less (at
// Subscribe, or after a Next). One that starts far back, a replay or a
// resume, is catching up until then and is not cut for its lag.
//
// # Fell behind, or gone
//
// A following subscription whose lag exceeds MaxLag when it calls Next is
// cut: Next returns *FellBehindError with ResumeIndex, its position. The
// lag is measured when Next is called, so only time spent outside Next
// counts against a subscriber, and a burst of more than MaxLag batches that
// it could not read in time cuts it too: MaxLag is the burst a subscriber
// is allowed to trail by. Because MaxLag < Size, the batches after
// ResumeIndex are still buffered at that moment, and a prompt
// Subscribe(Request{After: ResumeIndex}) continues with no gap and no
// duplicate; that new subscription is catching up, so it is not cut again
// while it reads the backlog.
//
// One subscription is never cut: one at index 0, which has dealt with no
// batch and started when nothing had been dropped. Its resume index would
// be 0, which Subscribe reads as "whatever is buffered", so a resume that
// came after a drop would skip batches unnoticed. It reads on instead, and
// is gone if the buffer drops its next batch before it reads it.
//
// A subscription whose next batch was dropped before it read it, whether
// catching up or idle for more than Size batches, gets *GoneError from
// Next; so does a Subscribe whose After is older than the buffer. Gone
// means events were lost to that subscriber and it must re-read the state
// they describe; the buffer never skips a batch silently. After == 0 means
// "whatever is buffered" and is never gone.
//
// # Closing
//
// Close wakes every waiter. Each subscription is then given the batches
// it had not read yet and ErrClosed after them, so a subscriber sees every
// event published before Close; Subscribe still works on a closed buffer,
// so one that fell behind just before Close can resume and drain too.
// Subscription.Close ends one subscription at once.
package stream
