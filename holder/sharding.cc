#include "holder/sharding.h"
