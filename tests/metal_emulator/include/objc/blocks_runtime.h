// Debian's GNUstep headers, built with -fblocks, include <objc/blocks_runtime.h>,
// which only libobjc2 ships; libBlocksRuntime's <Block.h> declares the same API.
#include <Block.h>
