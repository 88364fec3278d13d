"""glm5_lab: the lab's stand-ins (fakepve's front, the LXC reconciler, the stand-in programs): test fixtures only."""
