// make_link_arbiter: the arbiter a device's copy protocol needs (Note [One hook, two protocols]
// in device/copy_arbiter.h): the emulator for paced copies that emulate a server's link, the
// gatekeeper for gated copies under arbitration, none otherwise, and a refusal for gated copies
// whose path the topology does not show; and the topology scheduler's deadline, which travels
// with each copy to that arbiter.
#include <gtest/gtest.h>

#include <string>

#include "common/error.h"
#include "links/link_arbiter.h"
#include "links/link_emulator.h"
#include "links/link_gatekeeper.h"

namespace ferry {
namespace {

LinkArbiterOptions options(bool emulate, bool arbitrate) {
  LinkArbiterOptions o;
  o.rank = 1;
  o.path = {1, 2};
  o.arbitrated = {1};
  o.chunk_bytes = 1 << 20;
  o.link_gbps = 0.04;
  o.emulate = emulate;
  o.arbitrate = arbitrate;
  o.topology_source = "configs/topologies/dgx1-like.yaml";
  return o;
}

TEST(MakeLinkArbiter, PacedCopiesThatEmulateALinkGetTheEmulator) {
  for (bool arbitrate : {false, true}) {
    const std::shared_ptr<LinkArbiter> a =
        make_link_arbiter(CopyArbitration::kPaced, options(true, arbitrate));
    ASSERT_NE(a, nullptr);
    EXPECT_NE(a->pacer(), nullptr);
    EXPECT_EQ(a->gate(), nullptr);
    EXPECT_TRUE(a->emulates_links());
    const auto* e = dynamic_cast<const LinkEmulator*>(a.get());
    ASSERT_NE(e, nullptr);
    EXPECT_EQ(e->options().link_gbps, 0.04);
    EXPECT_EQ(e->options().arbitrate, arbitrate);
    EXPECT_EQ(e->options().path, (std::vector<int>{1, 2}));
    EXPECT_EQ(e->options().arbitrated, (std::vector<int>{1}));
    EXPECT_EQ(e->options().chunk_bytes, uint64_t{1} << 20);
    EXPECT_EQ(e->options().rank, 1);
  }
  // Nothing to emulate: plain copies, whatever the scheduler.
  EXPECT_EQ(make_link_arbiter(CopyArbitration::kPaced, options(false, true)), nullptr);
  EXPECT_EQ(make_link_arbiter(CopyArbitration::kPaced, options(false, false)), nullptr);
}

TEST(MakeLinkArbiter, GatedCopiesUnderArbitrationGetTheGatekeeper) {
  const std::shared_ptr<LinkArbiter> a =
      make_link_arbiter(CopyArbitration::kGated, options(false, true));
  ASSERT_NE(a, nullptr);
  EXPECT_NE(a->gate(), nullptr);
  EXPECT_EQ(a->pacer(), nullptr);
  EXPECT_FALSE(a->emulates_links());
  const auto* g = dynamic_cast<const LinkGatekeeper*>(a.get());
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(g->options().link_gbps, 0.04);
  EXPECT_EQ(g->options().path, (std::vector<int>{1, 2}));
  EXPECT_EQ(g->options().arbitrated, (std::vector<int>{1}));
  EXPECT_EQ(g->options().rank, 1);
  // A GPU's copies are real: no emulation, and without arbitration nothing gates them.
  EXPECT_EQ(make_link_arbiter(CopyArbitration::kGated, options(true, false)), nullptr);
}

TEST(MakeLinkArbiter, GatedCopiesWithoutAPathAreRefusedNamingTheTopology) {
  LinkArbiterOptions o = options(false, true);
  o.path.clear();
  try {
    make_link_arbiter(CopyArbitration::kGated, o);
    FAIL() << "no ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("topology.scheduler"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("dgx1-like.yaml"), std::string::npos) << e.what();
    EXPECT_NE(e.hint().find("topology.scheduler=fifo"), std::string::npos) << e.hint();
  }
  o = options(false, true);
  o.link_gbps = 0;
  EXPECT_THROW(make_link_arbiter(CopyArbitration::kGated, o), ConfigError);
}

}  // namespace
}  // namespace ferry
